"""Sleep mode puts the tiny Kyutai STT engine to sleep and wakes it (docs/serving.md#sleep-mode), with
``msgpack`` + ``websockets`` on ``/api/asr-streaming`` over 127.0.0.1. Beside the loopback engine (no
stages of its own) it is stage 0: asleep, a stream in flight ends with an ``engine_sleeping`` Error and
a new one is refused with it before ``Ready``; awake, a stream hears again, its marker comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import numpy as np
import pytest
import websockets

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.errors import ENGINE_SLEEPING
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.support import serve_app
from tests.web.asr_streaming.test_asr_streaming import FRAME, KEY, _config, _connect, _pack


@pytest.fixture(scope="module")
def stt_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stt_checkpoint(tmp_path_factory.mktemp("asr_streaming_sleep") / "weights").folder


@pytest.fixture
async def base(config: ServerConfig, stt_weights: Path) -> AsyncIterator[str]:
    sleepy = _config(config, stt_weights, 30.0).model_copy(update={"enable_sleep_mode": True})
    async with serve_app(build_app(sleepy)) as url:
        yield url


async def _omni(base: str, route: str, stage: int) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http,
        http.post(f"{base}/v1/omni/{route}", json={"stage_ids": [stage]}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


async def _send(ws: websockets.ClientConnection, audio: np.ndarray) -> None:
    for start in range(0, audio.size, FRAME):  # a frame a message: under the route's message bound
        await ws.send(_pack({"type": "Audio", "pcm": audio[start : start + FRAME].tolist()}))


async def _last_message(ws: websockets.ClientConnection) -> dict[str, Any]:
    """What the server sent last before it closed the socket."""
    last: dict[str, Any] = {}
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            last = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 30))
    return last


async def test_asleep_the_stt_refuses_typed_and_awake_it_hears_again(base: str) -> None:
    url = base.replace("http://", "ws://") + "/api/asr-streaming"
    noise = (0.3 * np.random.default_rng(0).standard_normal(10 * FRAME)).astype(np.float32)
    in_flight = await _connect(url)
    await _send(in_flight, noise)
    slept = await _omni(base, "sleep", 0)
    assert slept["acks"][0]["stage"] == "stt_engine"
    assert (await _last_message(in_flight))["code"] == ENGINE_SLEEPING
    refused = await websockets.connect(url, additional_headers={"kyutai-api-key": KEY})
    assert msgpack.unpackb(await refused.recv())["code"] == ENGINE_SLEEPING
    await refused.close()
    assert (await _omni(base, "wakeup", 0))["sleeping_stages"] == []
    awake = await _connect(url)
    await _send(awake, noise)
    await awake.send(_pack({"type": "Marker", "id": 7}))
    for _ in range(20):  # silence until the marker comes back, as Kyutai's clients send
        await awake.send(_pack({"type": "Audio", "pcm": [0.0] * FRAME}))
    while (message := msgpack.unpackb(await asyncio.wait_for(awake.recv(), 30)))["type"] != "Marker":
        pass
    assert message == {"type": "Marker", "id": 7}
    await awake.close()
