"""Client text -> the words a Kyutai TTS session speaks (docs/engines.md#kyutai-tts).

The reference prepares a script (``moshi.models.tts.script_to_entries``) by cleaning up a few
characters (a typographic apostrophe becomes ``'``, a colon a space, parentheses go), splitting on
whitespace, turning each ``<break time="Xs"/>`` into a pause of ``round(X * frame_rate)`` steps
(a word without tokens), putting the main speaker's token before the first word's tokens on a
multi-speaker model, and giving each word ``padding_between + tokens - 1`` forced pads.

A streaming client sends its text in pieces; as moshi-server does, each piece is a sequence of
whole words (a word is never joined across two pieces), and only the session's first word gets
the speaker token. Unlike the reference a pause is capped (``max_break_s``, moshi-server's 10 s),
so one message cannot ask for an unbounded silence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

_CLEANUP = str.maketrans({"\u2019": "'", ":": " ", "(": None, ")": None})
# A pause, or a run of whitespace: what separates words.
_SEPARATOR = re.compile(r"<break\s+time=\"([0-9]+(?:\.[0-9]*)?)s\"\s*/?>|\s+")


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Word:
    text: str  # "" for a pause
    tokens: tuple[int, ...]  # empty for a pause
    padding: int  # pads forced after the word (a pause's length in steps)


class ScriptSplitter:
    """One session's text -> words, as the reference prepares a one-turn script."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        speaker_token: int | None,
        frame_rate: float,
        padding_between: int = 1,
        max_break_s: float = 10.0,
    ) -> None:
        """``speaker_token``: put before the first word's tokens (None: a single-speaker model)."""
        self._tokenizer = tokenizer
        self._speaker_token = speaker_token
        self._frame_rate = frame_rate
        self._padding_between = padding_between
        self._max_break_s = max_break_s
        self._first = True

    def split(self, text: str) -> list[Word]:
        words: list[Word] = []
        line = text.translate(_CLEANUP)
        position = 0
        for match in _SEPARATOR.finditer(line):
            self._word(line[position : match.start()], words)
            position = match.end()
            seconds = match.group(1)
            if seconds is not None:
                padding = round(min(float(seconds), self._max_break_s) * self._frame_rate)
                words.append(Word("", (), padding))
        self._word(line[position:], words)
        return words

    def _word(self, text: str, words: list[Word]) -> None:
        if not text:
            return
        tokens = list(self._tokenizer.encode(text))
        if self._first and self._speaker_token is not None:
            tokens.insert(0, self._speaker_token)
        self._first = False
        padding = max(0, self._padding_between + len(tokens) - 1) if self._padding_between > 0 else 0
        words.append(Word(text, tuple(tokens), padding))
