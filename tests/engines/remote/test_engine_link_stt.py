"""One Kyutai STT engine per server: two front-ends (as ``--workers 2`` runs them) reach the
engine process's STT over the engine link; their ``/api/asr-streaming`` streams share its one
slot table, audio and markers round-trip, and a front-end whose link dies frees its slots
(docs/engines.md#kyutai-stt-engine)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import numpy as np
import pytest
import websockets
from prometheus_client import CollectorRegistry

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.remote.client import RemoteEngines
from rtserve.engines.remote.link import EngineLink
from rtserve.engines.remote.server import EngineServer
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.support import serve_app

FRAME = 1920  # 80 ms at 24 kHz
SLOTS = 2


@pytest.fixture(scope="module")
def stt_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stt_checkpoint(tmp_path_factory.mktemp("link_stt") / "weights").folder


@pytest.fixture
async def engine_socket(config: ServerConfig, stt_weights: Path, tmp_path: Path) -> AsyncIterator[str]:
    """An engine process's side: the engine set (its one STT engine) serving a Unix socket."""
    engines = EngineSet(_config(config, stt_weights), CollectorRegistry())
    server = EngineServer(engines)
    path = str(tmp_path / "engine.sock")
    await server.serve_unix(path)
    engines.start()
    try:
        yield path
    finally:
        await server.close()
        await engines.stop()


def _config(config: ServerConfig, stt_weights: Path) -> ServerConfig:
    return config.model_copy(
        update={
            "engine": "loopback",
            "stt_engine": config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": SLOTS}),
        }
    )


@contextlib.asynccontextmanager
async def _front_end(config: ServerConfig, path: str, index: int) -> AsyncIterator[tuple[str, RemoteEngines]]:
    """A worker's app, reaching the engine through its own link; its base URL and engines."""
    link = EngineLink(lambda: asyncio.open_unix_connection(path), index)
    link.start()
    await asyncio.wait_for(link.connected.wait(), 10)
    assert link.offer is not None and link.offer.stt is not None  # the engine offers its STT
    engines = RemoteEngines(link, link.offer, max_queued_events=config.engine_link.max_queued_events)
    async with serve_app(build_app(config, engines=engines)) as base:
        yield base, engines


async def _stream(base: str) -> websockets.ClientConnection:
    url = base.replace("http://", "ws://") + "/api/asr-streaming"
    for _ in range(200):  # the engine loads in the background: refused until it serves
        ws = await websockets.connect(url)
        first = msgpack.unpackb(await ws.recv())
        if first["type"] == "Ready":
            return ws
        assert first["code"] == "engine_unavailable", first
        await ws.close()
        await asyncio.sleep(0.05)
    raise AssertionError("the STT engine never became ready")


async def _refusal(base: str) -> dict[str, Any]:
    async with websockets.connect(base.replace("http://", "ws://") + "/api/asr-streaming") as ws:
        refusal: dict[str, Any] = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))
    return refusal


async def _slots_in_use(base: str) -> float:
    """The engine's STT slots taken, from a front-end's ``/metrics`` (every process's metrics)."""
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as response:
        text = await response.text()
    found = re.search(r"^rtserve_kyutai_stt_occupied_slots (\S+)$", text, re.MULTILINE)
    assert found is not None, "the STT engine's slots are not in /metrics"
    return float(found.group(1))


def _audio(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_single_float=True)
    return packed


async def test_two_front_ends_share_the_engines_one_stt_copy(
    config: ServerConfig, stt_weights: Path, engine_socket: str
) -> None:
    config = _config(config, stt_weights)  # workers read the same config: they must not load a copy
    async with _front_end(config, engine_socket, 0) as (a, _), _front_end(config, engine_socket, 1) as (b, b_engines):
        first, second = await _stream(a), await _stream(b)
        # One slot table for both front-ends: a copy per front-end would have a free slot left.
        assert await _slots_in_use(a) == await _slots_in_use(b) == SLOTS
        refused = await _refusal(b)
        assert refused["type"] == "Error" and refused["code"] == "resource_exhausted", refused

        # Audio pieces (not whole frames) and a marker round-trip over the link, in order.
        rng = np.random.default_rng(3)
        audio = (0.3 * rng.standard_normal(10 * FRAME)).astype(np.float32)
        for start in range(0, audio.size, 1000):
            await second.send(_audio({"type": "Audio", "pcm": audio[start : start + 1000].tolist()}))
        await second.send(_audio({"type": "Marker", "id": 9}))
        for _ in range(12):  # the model's delay, as Kyutai's clients send it
            await second.send(_audio({"type": "Audio", "pcm": [0.0] * FRAME}))
        steps = 0
        while (message := msgpack.unpackb(await asyncio.wait_for(second.recv(), 30)))["type"] != "Marker":
            assert message["type"] in ("Step", "Word", "EndWord"), message
            steps += message["type"] == "Step"
        assert message == {"type": "Marker", "id": 9}
        assert steps >= 10  # every frame sent before the marker was stepped

        # Front-end b's link dies with its stream open: the engine frees that slot, a stays served.
        await b_engines.stop()
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                message = msgpack.unpackb(await asyncio.wait_for(second.recv(), 10))
        assert message["type"] == "Error" and message["code"] == "engine_failure", message
        for _ in range(100):
            if await _slots_in_use(a) == SLOTS - 1:
                break
            await asyncio.sleep(0.05)
        assert await _slots_in_use(a) == SLOTS - 1
        third = await _stream(a)
        await first.send(_audio({"type": "Marker", "id": 1}))
        for _ in range(12):
            await first.send(_audio({"type": "Audio", "pcm": [0.0] * FRAME}))
        while (message := msgpack.unpackb(await asyncio.wait_for(first.recv(), 30)))["type"] != "Marker":
            pass
        assert message == {"type": "Marker", "id": 1}
        await first.close()
        await third.close()
