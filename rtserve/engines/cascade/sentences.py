"""Cut streamed text into sentences for the TTS, as soon as each one is complete.

A sentence ends at ``.``, ``!``, ``?`` or ``…`` (plus closing quotes/brackets) followed by
whitespace, or at a line break. Common abbreviations ("Dr.", "e.g.") and decimals
("3.14", no space) do not end one. A run longer than ``max_chars`` without an end is cut
after its last comma between words (else at a space; never inside "384,400"), so one
endless sentence cannot hold audio back; the first
piece has a tighter bound (``first_max_chars``), because it alone delays the first audio.

For the same reason the first piece may end at the first clause: with ``first_clause_chars``
set, a comma, semicolon, colon or dash followed by whitespace ends it once at least that
many characters came before it ("Sure, the capital of France is Paris." speaks "Sure, the
capital of France is Paris." whole at 12, but "The capital of France, as you know, is Paris."
starts speaking at "The capital of France,"). Later pieces are whole sentences: the reply
is already playing, and a sentence sounds better than its clauses.
"""

from __future__ import annotations

import re

_END = re.compile(r"""([.!?…]+["'”’)\]]*)(\s+)|(\n+)""")
_CLAUSE_END = re.compile(r"[,;:]\s|\s[-–—]+\s")
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "e.g", "i.e", "jr", "sr"})
_LONGEST_ABBREVIATION = max(map(len, _ABBREVIATIONS)) + 1  # with its trailing dots ("e.g.")
_MARKUP = re.compile(r"[*_#`~|<>\[\]]+")
_SPACES = re.compile(r"\s+")


def speakable(text: str) -> str:
    """Drop markdown/markup characters an LLM likes to emit; TTS would read them aloud."""
    return _SPACES.sub(" ", without_markup(text)).strip()


def without_markup(text: str) -> str:
    """The markup characters alone removed (spacing kept): safe on any piece of a streamed text."""
    return _MARKUP.sub("", text)


class SentenceSplitter:
    def __init__(
        self, max_chars: int = 240, first_max_chars: int | None = None, first_clause_chars: int | None = None
    ) -> None:
        self._max_chars = max_chars
        self._first_max_chars = first_max_chars or max_chars
        self._first_clause_chars = first_clause_chars
        self._emitted = False
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        """Add streamed text; return the sentences it completed (stripped, non-empty)."""
        self._buffer += text
        sentences: list[str] = []
        start = 0
        for match in _END.finditer(self._buffer):
            if match.group(1) and _ends_in_abbreviation(self._buffer, start, match.start()):
                continue
            sentences.append(self._buffer[start : match.end() - len(match.group(2) or match.group(3) or "")])
            start = match.end()
        self._buffer = self._buffer[start:]
        if not sentences and not self._emitted and self._first_clause_chars is not None:
            clause = self._first_clause()
            if clause:
                sentences.append(self._buffer[:clause])
                self._buffer = self._buffer[clause:]
        while len(self._buffer) > (limit := self._max_chars if self._emitted or sentences else self._first_max_chars):
            cut = self._buffer.rfind(", ", 0, limit + 1)  # a comma between words, not one in "384,400"
            if cut <= 0:
                cut = self._buffer.rfind(" ", 0, limit)
            cut = cut + 1 if cut > 0 else limit
            sentences.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
        pieces = [s.strip() for s in sentences if s.strip()]
        self._emitted = self._emitted or bool(pieces)
        return pieces

    def flush(self) -> str | None:
        """The unfinished tail at the end of the text, if any."""
        tail, self._buffer = self._buffer.strip(), ""
        return tail or None

    def _first_clause(self) -> int:
        """End (exclusive) of the first clause long enough to speak on its own; 0 when none yet."""
        assert self._first_clause_chars is not None
        for match in _CLAUSE_END.finditer(self._buffer):
            end = match.end() - 1  # after the comma or dash
            if len(self._buffer[:end].strip()) >= self._first_clause_chars:
                return end
        return 0


def _ends_in_abbreviation(text: str, start: int, end: int) -> bool:
    """Whether the word of ``text[start:end]`` that ends at ``end`` is an abbreviation. Only the
    last few characters are read: rereading the whole sentence at each candidate end made a
    text of many abbreviations quadratic (a 16 KiB stream of "e.g. " held the loop 1.2 s)."""
    word_start = max(start, end - _LONGEST_ABBREVIATION - 1)
    for index in range(end - 1, word_start - 1, -1):
        if text[index].isspace():
            word_start = index + 1
            break
    else:
        if word_start > start and not text[word_start - 1].isspace():
            return False  # a longer word than any abbreviation
    return text[word_start:end].lower().rstrip(".") in _ABBREVIATIONS


def split_sentences(text: str, max_chars: int = 240) -> list[str]:
    splitter = SentenceSplitter(max_chars)
    sentences = splitter.feed(text)
    tail = splitter.flush()
    return [*sentences, tail] if tail else sentences
