"""Whisper tiny.en through faster-whisper: TTS-made speech comes back as its words."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from cascade_support import Loaded, words

from rtserve.engines.protocols import EngineError

pytestmark = pytest.mark.models


async def test_final_transcript_has_the_key_words(cascade: Loaded, question_16k: np.ndarray) -> None:
    text = await cascade.engine.asr.decode(question_16k, final=True)
    assert {"capital", "france"} <= words(text)


async def test_streaming_gives_partials_then_exactly_one_final(cascade: Loaded, question_16k: np.ndarray) -> None:
    asr = cascade.engine.asr
    step = asr.partial_interval_samples  # one partial is due after every step of new audio

    async def in_chunks() -> AsyncIterator[np.ndarray]:
        for start in range(0, len(question_16k), step):
            # Partials are skipped while the model thread is busy (e.g. finishing an earlier
            # test's decode on a loaded machine): give it time, as a real-time stream would.
            async with asyncio.timeout(30):
                while not asr.idle:
                    await asyncio.sleep(0.01)
            yield question_16k[start:start + step]

    pieces = [piece async for piece in asr.transcribe(in_chunks())]
    assert [p.final for p in pieces].count(True) == 1 and pieces[-1].final
    assert len(pieces) >= 2, "no partial transcript while the audio streamed in"
    assert {"capital", "france"} <= words(pieces[-1].text)


async def test_english_only_model_refuses_another_language(cascade: Loaded, question_16k: np.ndarray) -> None:
    with pytest.raises(EngineError) as raised:
        await cascade.engine.asr.decode(question_16k, final=True, language="fr")
    assert raised.value.code == "unsupported_language"


async def test_too_short_audio_is_an_empty_transcript(cascade: Loaded) -> None:
    assert await cascade.engine.asr.decode(np.zeros(800, np.float32), final=True) == ""
