"""Whisper tiny.en through faster-whisper: TTS-made speech comes back as its words."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from rtserve.engines.cascade.whisper_window import fits, trusted
from rtserve.engines.errors import EngineError
from tests.engines.cascade.cascade_support import QUESTION, Loaded, heard_most_of

WINDOWS = "rtserve_cascade_asr_windows_total"

pytestmark = pytest.mark.models


async def test_final_transcript_has_most_of_the_words(cascade: Loaded, question_16k: np.ndarray) -> None:
    text = await cascade.whisper.decode(question_16k, final=True)
    assert heard_most_of(text, QUESTION), text


async def test_streaming_gives_partials_then_exactly_one_final(cascade: Loaded, question_16k: np.ndarray) -> None:
    asr = cascade.whisper
    step = asr.partial_interval_samples  # one partial is due after every step of new audio

    async def in_chunks() -> AsyncIterator[np.ndarray]:
        for start in range(0, len(question_16k), step):
            # Partials are skipped while the model thread is busy (e.g. finishing an earlier
            # test's decode on a loaded machine): give it time, as a real-time stream would.
            async with asyncio.timeout(30):
                while not asr.idle:
                    await asyncio.sleep(0.01)
            yield question_16k[start : start + step]

    pieces = [piece async for piece in asr.transcribe(in_chunks())]
    assert [p.final for p in pieces].count(True) == 1 and pieces[-1].final
    assert len(pieces) >= 2, "no partial transcript while the audio streamed in"
    assert heard_most_of(pieces[-1].text, QUESTION), pieces[-1].text


async def test_english_only_model_refuses_another_language(cascade: Loaded, question_16k: np.ndarray) -> None:
    with pytest.raises(EngineError) as raised:
        await cascade.whisper.decode(question_16k, final=True, language="fr")
    assert raised.value.code == "unsupported_language"


async def test_too_short_audio_is_an_empty_transcript(cascade: Loaded) -> None:
    assert await cascade.whisper.decode(np.zeros(800, np.float32), final=True) == ""


async def test_a_short_question_is_heard_in_the_short_window(cascade: Loaded, question_16k: np.ndarray) -> None:
    """The fast path (``cascade.asr_window_s``) is the one a voice turn takes, and it hears it;
    transcription requests keep Whisper's full window (accuracy over time)."""
    short, full = cascade.metric(WINDOWS, window="short"), cascade.metric(WINDOWS, window="full")
    text = await cascade.whisper.decode(question_16k, final=True, live_turn=True)
    assert heard_most_of(text, QUESTION), text
    assert cascade.metric(WINDOWS, window="short") == short + 1
    await cascade.whisper.decode(question_16k, final=True)
    assert cascade.metric(WINDOWS, window="full") == full + 1


def test_long_audio_and_the_full_window_take_the_full_decode() -> None:
    rate = 16_000
    assert not fits(6 * rate, rate, 10.0)  # more than half the window: too little silence after it
    assert not fits(rate, rate, 30.0)  # 30 s is Whisper's own window: the short one is off


def test_a_transcript_that_repeats_itself_is_not_trusted() -> None:
    """What a too-short window does to Whisper: it loops; the full window decodes such audio again."""
    assert trusted("What is the capital of France?", -0.2)
    assert not trusted(" ".join(["What is the capital of France?"] * 8), -0.2)
    assert not trusted("What is the capital of France?", -1.5)  # the decoder was unsure
