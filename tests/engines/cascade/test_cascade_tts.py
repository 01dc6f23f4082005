"""Piper TTS (and the espeak-ng fallback): sentence streaming at 24 kHz."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ModelPaths
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_tts
from rtserve.engines.cascade.tts import SAMPLE_RATE, TextToSpeech
from rtserve.engines.errors import EngineError
from tests.engines.cascade.cascade_support import Loaded

pytestmark = pytest.mark.models

THREE_SENTENCES = "The first sentence is short. Here comes the second one! And is this the third?"


async def test_first_sentence_arrives_before_the_rest_is_synthesized(cascade: Loaded) -> None:
    before = cascade.metric("rtserve_cascade_model_call_seconds_count", stage="tts_sentence")
    stream = cascade.piper.synthesize(THREE_SENTENCES)
    first = await anext(stream)
    synthesized_so_far = cascade.metric("rtserve_cascade_model_call_seconds_count", stage="tts_sentence") - before
    rest = [chunk async for chunk in stream]
    assert synthesized_so_far == 1
    assert len(rest) == 2
    for chunk in [first, *rest]:
        assert chunk.dtype == np.float32 and chunk.ndim == 1
        assert 0.3 * SAMPLE_RATE < len(chunk) < 5 * SAMPLE_RATE  # about one sentence of speech
        assert np.abs(chunk).max() > 0.1


async def test_speed_changes_duration(cascade: Loaded) -> None:
    tts = cascade.piper
    normal = await tts.render("This sentence is spoken at two speeds.")
    fast = await tts.render("This sentence is spoken at two speeds.", speed=2.0)
    assert len(fast) < 0.8 * len(normal)  # about 0.63: pauses do not shrink as much as speech


async def test_voices_unknown_names_and_bad_speed(cascade: Loaded) -> None:
    tts = cascade.piper
    assert tts.voices == ("joe",)
    assert [c async for c in tts.synthesize("Hi.", voice="alloy")]  # OpenAI names select the voice
    for kwargs, code in (({"voice": "nobody"}, "invalid_voice"), ({"speed": 9.0}, "invalid_value")):
        with pytest.raises(EngineError) as raised:
            await anext(tts.synthesize("Hi.", **kwargs))
        assert raised.value.code == code


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
async def test_espeak_fallback_voice() -> None:
    location = resolve_tts(ModelPaths(tts="espeak-ng"))
    tts = TextToSpeech(location, cpu_threads=1, max_queue=4, metrics=CascadeMetrics(CollectorRegistry()))
    await tts.start()
    try:
        assert tts.model_name == "espeak-ng"
        chunks = [c async for c in tts.synthesize("Hello there. How are you?")]
        assert len(chunks) == 2 and all(np.abs(c).max() > 0.05 for c in chunks)
    finally:
        tts.stop()
