"""An engine whose build fails on something other than its settings or weights (out of GPU memory
beside another process's models, a device fault) says so: its streams are refused with the reason
and the log has it. Such a failure used to die unseen with the start's task: a TTS server whose
GPU was taken by the agent's in-process LLM answered "not running" for minutes with an empty log.
While an engine loads, its streams are told it is still loading."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import torch
import websockets

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine
from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine
from rtserve.errors import ENGINE_UNAVAILABLE
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app

OUT_OF_MEMORY = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.12 GiB "
    "is free.\nIf reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("start_failures") / "tts")


def _tts_config(config: ServerConfig, tiny: TinyTTS) -> ServerConfig:
    update = {"weights": str(tiny.folder), "voices": str(tiny.voices), "max_sessions": 2, "young_batch": 2}
    return config.model_copy(update={"tts_engine": config.tts_engine.model_copy(update=update)})


def _raise(error: Exception) -> Any:
    def build(*args: Any) -> Any:
        raise error

    return build


async def test_a_tts_engine_out_of_gpu_memory_refuses_its_streams_saying_so(
    config: ServerConfig, tiny: TinyTTS, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(KyutaiTTSEngine, "_build_batches", _raise(torch.OutOfMemoryError(OUT_OF_MEMORY)))
    engine = KyutaiTTSEngine(_tts_config(config, tiny))
    with caplog.at_level(logging.ERROR):
        await engine.start()  # returns: the failure is kept, not raised into a task nobody awaits
    try:
        assert not engine.ready
        failure = engine.failure
        assert failure is not None and failure.startswith("out of GPU memory while building the engine")
        assert "tts_engine.max_sessions" in failure and "1.12 GiB is free" in failure
        assert "PYTORCH_CUDA_ALLOC_CONF" not in failure  # the first line, not torch's advice
        with pytest.raises(EngineError) as refused:
            await engine.open_stream("s1", None)
        assert refused.value.code == ENGINE_UNAVAILABLE and refused.value.message == failure
        assert any(failure in record.getMessage() for record in caplog.records)
    finally:
        await engine.stop()


async def test_a_tts_engine_asked_for_more_codebooks_than_its_checkpoint_has_refuses_its_streams_saying_so(
    config: ServerConfig, tiny: TinyTTS
) -> None:
    tts = _tts_config(config, tiny)
    engine = KyutaiTTSEngine(tts.model_copy(update={"tts_engine": tts.tts_engine.model_copy(update={"codebooks": 9})}))
    await engine.start()
    try:
        assert not engine.ready
        assert engine.failure == "tts_engine: codebooks=9: this checkpoint generates at most 8 audio codebooks"
        with pytest.raises(EngineError) as refused:
            await engine.open_stream("s1", None)
        assert refused.value.code == ENGINE_UNAVAILABLE and refused.value.message == engine.failure
    finally:
        await engine.stop()


async def test_an_stt_engine_whose_device_faulted_refuses_its_streams_saying_so(
    config: ServerConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fault = RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(KyutaiSttEngine, "_frame_model", _raise(fault))
    weights = write_stt_checkpoint(tmp_path / "stt").folder
    settings = config.stt_engine.model_copy(update={"weights": str(weights), "batch_size": 2})
    engine = KyutaiSttEngine(config.model_copy(update={"stt_engine": settings}))
    with caplog.at_level(logging.ERROR):
        await engine.start()
    try:
        assert engine.failure == "RuntimeError: CUDA error: an illegal memory access was encountered"
        with pytest.raises(EngineError) as refused:
            await engine.open_stream("s1")
        assert refused.value.code == ENGINE_UNAVAILABLE and refused.value.message == engine.failure
        assert any(engine.failure in record.getMessage() for record in caplog.records)
    finally:
        await engine.stop()


async def test_a_stream_opened_while_the_engine_loads_is_told_so(
    config: ServerConfig, tiny: TinyTTS, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    build = KyutaiTTSEngine._build_batches

    def held(self: KyutaiTTSEngine, loaded: Any) -> Any:
        release.wait(30)
        return build(self, loaded)

    monkeypatch.setattr(KyutaiTTSEngine, "_build_batches", held)
    engine = KyutaiTTSEngine(_tts_config(config, tiny))
    starting = asyncio.create_task(engine.start())
    try:
        with pytest.raises(EngineError) as loading:
            for _ in range(100):  # until the start has loaded the weights and waits in the build
                await asyncio.sleep(0.05)
                await engine.open_stream("early", None)
        assert loading.value.code == ENGINE_UNAVAILABLE
        assert loading.value.message == "the text-to-speech engine is still loading"
        release.set()
        await starting
        assert engine.ready, engine.failure
        stream = await engine.open_stream("later", "alice")
        await stream.close()
    finally:
        release.set()
        await starting
        await engine.stop()


async def test_the_tts_route_tells_its_client_why_the_engine_is_not_serving(
    config: ServerConfig, tiny: TinyTTS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KyutaiTTSEngine, "_build_batches", _raise(torch.OutOfMemoryError(OUT_OF_MEMORY)))
    async with serve_app(build_app(_tts_config(config, tiny).model_copy(update={"engine": "loopback"}))) as base:
        url = base.replace("http", "ws") + "/api/tts_streaming?voice=alice"
        for _ in range(200):  # the engine starts in the background: "still loading" until it has failed
            async with websockets.connect(url) as ws:
                first = msgpack.unpackb(await ws.recv())
            if "still loading" not in first.get("message", ""):
                break
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as http, http.get(base + "/health") as response:
            health = (response.status, await response.json())
    assert first["type"] == "Error" and first["code"] == ENGINE_UNAVAILABLE
    assert first["message"].startswith("out of GPU memory while building the engine")
    # The server's only engine of use does not serve: a load balancer's probe must not see "ok".
    assert health[0] == 503 and health[1]["status"] == "failed" and health[1]["code"] == "engine_failed"
