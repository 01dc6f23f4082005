"""The HTTP generation routes through a cluster front-end: two cascade engine actors (the
embedded models) on the two-raylet cluster, called with the official OpenAI SDK over a real
socket; sleep and wake reach every engine actor, and while one sleeps the front-end refuses work.
"""

from __future__ import annotations

import asyncio
import functools
import io
import re
import wave
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from rtserve.cluster.engines import ClusterEngines
from tests.web.http_support import sdk

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tests.cluster.ray_support import cluster_config, front_end, kill_engines  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.models, pytest.mark.asyncio(loop_scope="module")]
PREFIX = "rtserve-test-cascade"
ENGINES = [f"{PREFIX}-0", f"{PREFIX}-1"]
SENTENCE = "The quick brown fox jumps over the lazy dog."
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
TTS_STAGE = 3  # the cascade's sleep stages: 0 VAD, 1 ASR, 2 LLM, 3 TTS
LOAD_TIMEOUT_S = 300  # both actors load Whisper, SmolLM2 and Piper on a shared small machine


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cascade(ray_cluster: Cluster) -> AsyncIterator[tuple[str, ClusterEngines]]:
    """One front-end of two cascade engine actors for the module (loading the models is the slow part)."""
    config = cluster_config(ray_cluster.address, engine="cascade", prefix=PREFIX)
    config.enable_sleep_mode = True
    try:
        async with front_end(config, serving_timeout_s=LOAD_TIMEOUT_S) as served:
            yield served
    finally:
        kill_engines(config)  # the loaded models' memory back before the next module


async def speak(base: str, text: str) -> bytes:
    speech = await asyncio.to_thread(
        sdk(base).audio.speech.create, model="piper-joe", voice="alloy", input=text, response_format="wav"
    )
    return speech.content


async def test_chat_completion_through_the_cluster(cascade: tuple[str, ClusterEngines]) -> None:
    base, _ = cascade
    completion = await asyncio.to_thread(
        functools.partial(
            sdk(base).chat.completions.create,
            model="smollm2-135m-instruct",
            temperature=0,
            max_tokens=12,
            messages=MESSAGES,
        )
    )
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and words(choice.message.content or "")
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 12
    # vLLM's /tokenize through an engine actor counts the prompt the completion reported.
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/tokenize", json={"messages": MESSAGES}) as resp:
            counted = await resp.json()
    assert resp.status == 200 and counted["count"] == completion.usage.prompt_tokens, counted


async def test_speech_through_the_cluster_is_a_wav_of_speech(cascade: tuple[str, ClusterEngines]) -> None:
    base, _ = cascade
    with wave.open(io.BytesIO(await speak(base, SENTENCE))) as wav:
        rate, width, frames = wav.getframerate(), wav.getsampwidth(), wav.readframes(wav.getnframes())
    samples = np.frombuffer(frames, np.int16)
    assert width == 2 and rate > 0
    assert len(samples) / rate > 1.0  # a nine-word sentence, spoken
    assert np.abs(samples).max() > 1000  # not silence


async def test_transcription_through_the_cluster_hears_the_synthesized_words(
    cascade: tuple[str, ClusterEngines],
) -> None:
    base, _ = cascade
    speech = await speak(base, SENTENCE)
    transcript = await asyncio.to_thread(
        sdk(base).audio.transcriptions.create, model="whisper-tiny.en", file=("speech.wav", speech)
    )
    assert {"quick", "brown", "fox", "lazy", "dog"} <= set(words(transcript.text))


async def test_sleep_and_wake_reach_every_engine_actor(cascade: tuple[str, ClusterEngines]) -> None:
    base, engines = cascade
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/omni/sleep", json={"stage_ids": [TTS_STAGE]}) as response:
            assert response.status == 200
            slept = await response.json()
        assert slept["stage_ids"] == [TTS_STAGE] and slept["sleeping_stages"] == [TTS_STAGE]
        [ack] = slept["acks"]
        assert ack["stage"] == "tts" and sorted(ack["engines"]) == ENGINES and ack["level"] == 1
        asleep = engines.sleeping
        assert asleep == (TTS_STAGE,)
        assert all(TTS_STAGE in member.remote.sleeping for member in engines.members)

        # Asleep anywhere: the front-end refuses work at once, whichever engine would have served it.
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "alloy"}) as response:
            assert response.status == 503
            assert (await response.json())["error"]["code"] == "engine_sleeping"

        async with http.post(f"{base}/v1/omni/wakeup", json={"stage_ids": [TTS_STAGE]}) as response:
            assert response.status == 200
            woken = await response.json()
        assert woken["stage_ids"] == [TTS_STAGE] and woken["sleeping_stages"] == []
        assert sorted(woken["acks"][0]["engines"]) == ENGINES
        assert engines.sleeping == ()

        async with http.post(f"{base}/v1/omni/wakeup", json={}) as response:  # awake everywhere: a no-op
            assert response.status == 200 and (await response.json())["acks"] == []
    assert len(await speak(base, "Awake again.")) > 44  # more than a WAV header
