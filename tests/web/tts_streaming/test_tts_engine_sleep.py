"""Sleep mode puts the tiny Kyutai TTS engine to sleep and wakes it (docs/serving.md#sleep-mode), over
127.0.0.1 with the real clients: ``msgpack`` + ``websockets`` on ``/api/tts_streaming`` and the
official ``openai`` SDK on ``/v1/audio/speech``. Beside the loopback engine (no stages of its own) it
is stage 0: asleep, a stream in flight ends with ``engine_sleeping`` and new ones are refused with it
before ``Ready``, speech is 503 ``engine_sleeping``; awake, both speak again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import openai
import pytest
import websockets

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.errors import ENGINE_SLEEPING
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app
from tests.web.http_support import sdk
from tests.web.tts_streaming.test_tts_streaming import KEY, _connect, _pack, _speak


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("tts_engine_sleep") / "weights")


@pytest.fixture
async def base(config: ServerConfig, tiny: TinyTTS) -> AsyncIterator[str]:
    cfg = config.model_copy(
        update={
            "engine": "loopback",
            "api_key": KEY,
            "enable_sleep_mode": True,
            "tts_engine": config.tts_engine.model_copy(
                update={"weights": str(tiny.folder), "voices": str(tiny.voices), "max_sessions": 2, "temperature": 0.0}
            ),
        }
    )
    async with serve_app(build_app(cfg)) as url:
        yield url


async def _omni(base: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http,
        http.post(f"{base}/v1/omni/{route}", json=body) as resp,
    ):
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


def _speech(base: str) -> bytes:
    return sdk(base, api_key=KEY).audio.speech.create(model="tts-1", voice="alice", input="the fox").content


async def _error(ws: websockets.ClientConnection) -> dict[str, Any]:
    """The socket's last message before the server closed it (1013, try again later): its ``Error``."""
    messages = []
    with pytest.raises(websockets.ConnectionClosedError):
        while True:
            messages.append(msgpack.unpackb(await ws.recv()))
    assert ws.close_code == 1013
    assert messages and messages[-1]["type"] == "Error", messages
    last: dict[str, Any] = messages[-1]
    return last


async def test_asleep_the_engine_refuses_typed_and_awake_it_speaks_again(base: str) -> None:
    url = base.replace("http://", "ws://") + "/api/tts_streaming"
    assert (await _speak(url, ["the quick fox"])).audio
    in_flight = await _connect(url)  # holds a slot, text still coming
    await in_flight.send(_pack({"type": "Text", "text": "the lazy"}))

    asleep = await _omni(base, "sleep", {"level": 1})
    assert asleep["sleeping_stages"] == [0]
    assert [(a["stage"], a["status"]) for a in asleep["acks"]] == [("tts_engine", "SUCCESS")]
    assert (await _error(in_flight))["code"] == ENGINE_SLEEPING

    async with websockets.connect(f"{url}?voice=alice", additional_headers={"kyutai-api-key": KEY}) as ws:
        first = msgpack.unpackb(await ws.recv())
        assert first["type"] == "Error" and first["code"] == ENGINE_SLEEPING, first
    with pytest.raises(openai.APIStatusError) as refused:
        await asyncio.to_thread(_speech, base)
    assert refused.value.status_code == 503 and refused.value.code == ENGINE_SLEEPING

    awake = await _omni(base, "wakeup", {})
    assert awake["sleeping_stages"] == [] and awake["stage_ids"] == [0]
    spoken = await _speak(url, ["the quick fox"])
    assert spoken.audio and [w["text"] for w in spoken.words] == ["the", "quick", "fox"]
    assert await asyncio.to_thread(_speech, base)
