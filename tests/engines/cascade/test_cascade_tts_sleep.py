"""Sleep mode and the TTS stage's speech in flight (issue 30, docs/serving.md#sleep-mode): a sleep
refuses new speech at once but lets a started synthesis finish, so an HTTP body is never cut
short; still busy after ``cascade.sleep_drain_timeout_s``, the sleep is refused and the stage
stays awake. Uses the espeak-ng voice (no model wheels needed)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ModelPaths
from rtserve.engines.cascade.errors import EngineSleeping
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_tts
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.errors import EngineError

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")

TWO_SENTENCES = "Hello there. How are you today?"


@pytest.fixture
async def espeak(request: pytest.FixtureRequest) -> AsyncIterator[TextToSpeech]:
    drain_s = getattr(request, "param", 30.0)
    location = resolve_tts(ModelPaths(tts="espeak-ng"))
    tts = TextToSpeech(
        location,
        cpu_threads=1,
        max_queue=4,
        metrics=CascadeMetrics(CollectorRegistry()),
        sleep_drain_timeout_s=drain_s,
    )
    await tts.start()
    try:
        yield tts
    finally:
        tts.stop()


async def test_a_sleep_waits_for_the_speech_in_flight_and_refuses_new_speech(espeak: TextToSpeech) -> None:
    stream = espeak.synthesize(TWO_SENTENCES)
    first = await anext(stream)
    sleeping = asyncio.create_task(espeak.release())
    await asyncio.sleep(0.05)
    assert not sleeping.done() and espeak.asleep and espeak.ready
    with pytest.raises(EngineSleeping):
        await anext(espeak.synthesize("Anyone else?"))
    rest = [chunk async for chunk in stream]  # the started speech is spoken to its end
    assert first.size and len(rest) == 1 and rest[0].size
    await asyncio.wait_for(sleeping, 10)
    assert espeak.asleep and not espeak.ready
    await espeak.restore()
    assert [chunk async for chunk in espeak.synthesize("Back.")]


@pytest.mark.parametrize("espeak", [0.1], indirect=True)
async def test_speech_outlasting_the_drain_bound_refuses_the_sleep(espeak: TextToSpeech) -> None:
    stream = espeak.synthesize(TWO_SENTENCES)
    await anext(stream)  # a client that stopped reading holds its stream open
    with pytest.raises(EngineError) as refused:
        await espeak.release()
    assert refused.value.code == "stage_busy"
    assert not espeak.asleep and espeak.ready  # still awake: the speech and new requests go on
    assert len([chunk async for chunk in stream]) == 1
    assert [chunk async for chunk in espeak.synthesize("Still here.")]
    await espeak.release()  # nothing in flight now
    assert espeak.asleep
