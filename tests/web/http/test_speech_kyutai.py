"""The speech routes spoken by the tiny Kyutai TTS engine (``tts_engine.weights``; CPU, random
weights) through the official ``openai`` SDK over 127.0.0.1 (docs/engines.md#kyutai-tts-over-http):
files in the route's formats, streamed bodies, OpenAI's SSE events, the voices of the folder, and
the typed refusals (an unknown voice before any slot is taken; a speed the model cannot do)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import openai
import pytest
import torch

from rtserve.app import build_app
from rtserve.config import ServerConfig
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app
from tests.web.http.test_http_speech import decode
from tests.web.http_support import sdk

TEXT = "the fox"
FRAME_S = 0.08


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    torch.set_num_threads(1)  # one thread each: the engine shares two cores with the server and the client
    return write_tts_checkpoint(tmp_path_factory.mktemp("speech_kyutai") / "weights")


@pytest.fixture
async def base(config: ServerConfig, tiny: TinyTTS) -> AsyncIterator[str]:
    cfg = config.model_copy(
        update={
            "engine": "loopback",
            "tts_engine": config.tts_engine.model_copy(
                update={
                    "weights": str(tiny.folder),
                    "voices": str(tiny.voices),
                    "default_voice": "bob",
                    "max_sessions": 1,
                    "temperature": 0.0,
                }
            ),
        }
    )
    async with serve_app(build_app(cfg)) as url, aiohttp.ClientSession() as http:
        for _ in range(600):  # the engine loads in the background: no voices until it serves
            async with http.get(f"{url}/v1/audio/voices") as resp:
                if resp.status == 200 and (await resp.json())["voices"]:
                    break
            await asyncio.sleep(0.05)
        yield url


def _speech(base: str, **kwargs: object) -> bytes:
    response = sdk(base).audio.speech.create(model="tts-1", input=TEXT, **kwargs)  # type: ignore[arg-type]
    return response.content


@pytest.mark.parametrize("response_format", ["wav", "opus"])
async def test_sdk_speech_decodes_to_whole_frames_of_audio(base: str, response_format: str) -> None:
    data = await asyncio.to_thread(_speech, base, voice="alice", response_format=response_format)
    pcm, rate = decode(data, response_format)
    assert rate in (24000, 48000)
    seconds = pcm.size / rate
    assert seconds >= 3 * FRAME_S  # two words and the tail: several frames
    assert np.isfinite(pcm).all() and np.abs(pcm).max() > 0
    if response_format != "opus":  # lossless: exactly whole 80 ms frames
        assert pcm.size % round(FRAME_S * rate) == 0


async def test_the_same_request_speaks_the_same_audio_and_openai_voice_names_are_the_default(base: str) -> None:
    alice = await asyncio.to_thread(_speech, base, voice="alice", response_format="pcm")
    bob, alloy = [
        await asyncio.to_thread(_speech, base, voice=voice, response_format="pcm") for voice in ("bob", "alloy")
    ]
    # Greedy: a stream is reproducible (the slot was reset between them); tts_engine.default_voice is bob.
    assert alloy == bob != alice


async def test_streaming_response_arrives_in_pieces_as_the_engine_speaks(base: str) -> None:
    def stream() -> list[bytes]:
        with sdk(base).audio.speech.with_streaming_response.create(
            model="tts-1", voice="alice", input=TEXT, response_format="pcm"
        ) as response:
            assert response.headers["content-type"].startswith("audio/pcm")
            return list(response.iter_bytes(3840))

    chunks = await asyncio.to_thread(stream)
    assert len(chunks) > 1 and sum(map(len, chunks)) % 2 == 0


async def test_sse_carries_speech_audio_deltas_then_done(base: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{base}/v1/audio/speech",
            json={"model": "tts-1", "input": TEXT, "voice": "alice", "response_format": "pcm", "stream_format": "sse"},
        ) as resp,
    ):
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        events = [json.loads(line[6:]) for line in (await resp.text()).splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    plain = await asyncio.to_thread(_speech, base, voice="alice", response_format="pcm")
    assert pcm == plain
    assert events[-1]["usage"]["output_tokens"] == len(pcm) // 2


async def test_voices_lists_the_folder_and_refuses_uploads(base: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/audio/voices") as resp:
        listed = await resp.json()
    assert listed["voices"] == ["alice", "bob"]
    assert all(voice["builtin"] for voice in listed["data"])
    form = aiohttp.FormData({"name": "carol", "model": b"x", "config": b"{}"})
    async with aiohttp.ClientSession() as http, http.post(f"{base}/v1/audio/voices", data=form) as resp:
        assert (await resp.json())["error"]["code"] == "voice_registration_unsupported"


async def test_an_unknown_voice_is_refused_before_a_slot_is_taken(base: str) -> None:
    for _ in range(2):  # max_sessions is 1: a refusal that held the slot would leave none
        with pytest.raises(openai.NotFoundError) as caught:
            await asyncio.to_thread(_speech, base, voice="nobody", response_format="pcm")
        assert caught.value.code == "voice_not_found"
    assert await asyncio.to_thread(_speech, base, voice="alice", response_format="pcm")


async def test_a_speed_the_model_cannot_speak_is_a_typed_error(base: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await asyncio.to_thread(_speech, base, voice="alice", response_format="pcm", speed=1.5)
    assert caught.value.code == "invalid_value"
