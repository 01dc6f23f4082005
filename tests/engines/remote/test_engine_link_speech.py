"""One Kyutai STT and one Kyutai TTS engine per server: two front-ends (as ``--workers 2``
runs them) reach the engine process's engines over the engine link. Their ``/api/asr-streaming``
and ``/api/tts_streaming`` streams share each engine's one slot table, audio, markers, text and
speech round-trip, and a front-end whose link dies frees its slots
(docs/engines.md#kyutai-stt-engine, docs/engines.md#kyutai-tts-over-http)."""

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
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app

FRAME = 1920  # 80 ms at 24 kHz
SLOTS = 2


@pytest.fixture(scope="module")
def stt_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stt_checkpoint(tmp_path_factory.mktemp("link_stt") / "weights").folder


@pytest.fixture(scope="module")
def tts(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("link_tts") / "weights")


@contextlib.asynccontextmanager
async def _engine_process(config: ServerConfig, folder: Path) -> AsyncIterator[str]:
    """An engine process's side: the engine set serving a Unix socket (its path)."""
    engines = EngineSet(config, CollectorRegistry())
    server = EngineServer(engines)
    path = str(folder / "engine.sock")
    await server.serve_unix(path)
    engines.start()
    try:
        yield path
    finally:
        await server.close()
        await engines.stop()


@contextlib.asynccontextmanager
async def _front_end(config: ServerConfig, path: str, index: int) -> AsyncIterator[tuple[str, RemoteEngines]]:
    """A worker's app, reaching the engine through its own link; its base URL and engines.
    Workers read the engine process's config: they must not load a model copy from it."""
    link = EngineLink(lambda: asyncio.open_unix_connection(path), index)
    link.start()
    await asyncio.wait_for(link.connected.wait(), 10)
    assert link.offer is not None
    engines = RemoteEngines(link, link.offer, max_queued_events=config.engine_link.max_queued_events)
    async with serve_app(build_app(config, engines=engines)) as base:
        yield base, engines


async def _ready_socket(url: str) -> websockets.ClientConnection:
    for _ in range(200):  # the engine loads in the background: refused until it serves
        ws = await websockets.connect(url)
        first = msgpack.unpackb(await ws.recv())
        if first["type"] == "Ready":
            return ws
        assert first["code"] == "engine_unavailable", first
        await ws.close()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never became ready")


async def _stream(base: str) -> websockets.ClientConnection:
    return await _ready_socket(base.replace("http://", "ws://") + "/api/asr-streaming")


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
    config: ServerConfig, stt_weights: Path, tmp_path: Path
) -> None:
    config = config.model_copy(
        update={
            "engine": "loopback",
            "stt_engine": config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": SLOTS}),
        }
    )
    async with (
        _engine_process(config, tmp_path) as path,
        _front_end(config, path, 0) as (a, _),
        _front_end(config, path, 1) as (b, b_engines),
    ):
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


async def _speaker(base: str) -> websockets.ClientConnection:
    return await _ready_socket(base.replace("http://", "ws://") + "/api/tts_streaming?voice=alice")


async def _spoken(ws: websockets.ClientConnection, text: str) -> tuple[list[str], int]:
    """Speak ``text`` to the end: the words reported and the audio samples received."""
    await ws.send(msgpack.packb({"type": "Text", "text": text}))
    await ws.send(msgpack.packb({"type": "Eos"}))
    words, samples = [], 0
    async for data in ws:
        message = msgpack.unpackb(data)
        if message["type"] == "Audio":
            samples += len(message["pcm"])
        else:
            assert message["type"] == "Text", message
            words.append(message["text"])
    assert ws.close_code == 1000
    return words, samples


async def test_two_front_ends_share_the_engines_one_tts_copy(
    config: ServerConfig, tts: TinyTTS, tmp_path: Path
) -> None:
    config = config.model_copy(
        update={
            "engine": "loopback",
            "tts_engine": config.tts_engine.model_copy(
                update={"weights": str(tts.folder), "voices": str(tts.voices), "max_sessions": 1, "temperature": 0.0}
            ),
        }
    )
    async with (
        _engine_process(config, tmp_path) as path,
        _front_end(config, path, 0) as (a, _),
        _front_end(config, path, 1) as (b, _),
    ):
        speaker = await _speaker(a)
        # The engine's one slot is a's: b is refused before Ready, as moshi-server refuses.
        async with websockets.connect(b.replace("http://", "ws://") + "/api/tts_streaming?voice=alice") as other:
            refusal = msgpack.unpackb(await asyncio.wait_for(other.recv(), 10))
        assert refusal == {"type": "Error", "message": "no free channels", "code": "resource_exhausted"}
        # Text goes over a's link, words and audio come back, then a normal close frees the slot.
        words, samples = await _spoken(speaker, "the quick brown")
        assert words == ["the", "quick", "brown"] and samples > 0 and samples % FRAME == 0
        words, _ = await _spoken(await _speaker(b), "the lazy dog")
        assert words == ["the", "lazy", "dog"]
