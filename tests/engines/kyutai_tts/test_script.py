"""``ScriptSplitter`` against the reference's ``script_to_entries`` (moshi.models.tts) on the tiny
checkpoint's tokenizer: the same words, tokens and padding, whether the text comes whole or in
pieces split at spaces."""

from __future__ import annotations

import pytest
import sentencepiece
from moshi.models.tts import TokenIds, script_to_entries

from rtserve.engines.kyutai_tts.script import ScriptSplitter, Word
from tests.engines.kyutai_tts.tiny import TEXT_CARD, TinyTTS

TEXTS = [
    "hello world",
    "Hello: (quietly) it\u2019s   a  test,\tof the\nsplitter!",
    'one <break time="0.5s"/> two<break time="1s"/>three <break time="0.25s">',
    "  leading and trailing  ",
    "",
]


def _reference(tokenizer: sentencepiece.SentencePieceProcessor, text: str, multi: bool, between: int) -> list[Word]:
    entries = script_to_entries(tokenizer, TokenIds(TEXT_CARD + 1), 12.5, [text], multi, between)
    return [Word(entry.text, tuple(entry.tokens), entry.padding) for entry in entries]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize(("multi", "between"), [(True, 1), (False, 0), (True, 3)])
def test_whole_text_matches_the_reference(tiny_tts: TinyTTS, text: str, multi: bool, between: int) -> None:
    tokenizer = sentencepiece.SentencePieceProcessor(str(tiny_tts.folder / "tokenizer.model"))
    splitter = ScriptSplitter(tokenizer, speaker_token=1 if multi else None, frame_rate=12.5, padding_between=between)
    assert splitter.split(text) == _reference(tokenizer, text, multi, between)


def test_pieces_split_at_spaces_give_the_words_of_the_whole(tiny_tts: TinyTTS) -> None:
    tokenizer = sentencepiece.SentencePieceProcessor(str(tiny_tts.folder / "tokenizer.model"))
    text = 'The quick brown fox <break time="0.5s"/> jumps over: the lazy dog.'
    splitter = ScriptSplitter(tokenizer, speaker_token=1, frame_rate=12.5)
    pieces = ["The quick ", "brown", " fox ", '<break time="0.5s"/>', " jumps over: the", " lazy dog."]
    words = [word for piece in pieces for word in splitter.split(piece)]
    assert words == _reference(tokenizer, text, True, 1)
    assert words[0].tokens[0] == 1 and all(1 not in word.tokens for word in words[1:])


def test_a_break_is_capped(tiny_tts: TinyTTS) -> None:
    tokenizer = sentencepiece.SentencePieceProcessor(str(tiny_tts.folder / "tokenizer.model"))
    splitter = ScriptSplitter(tokenizer, speaker_token=1, frame_rate=12.5, max_break_s=10.0)
    assert splitter.split('<break time="3600s"/>') == [Word("", (), 125)]
