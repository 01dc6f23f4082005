"""The Kyutai STT and TTS engines build their batches (KV, and CUDA graphs on a GPU: seconds) off the
event loop, so an engine starting or waking from sleep mode does not stall the sessions the process's
loop serves meanwhile. The build is slowed here to what a GPU's graph capture costs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.kyutai_stt import engine as stt_engine
from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_tts import engine as tts_engine
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.engines.kyutai_tts.tiny import write_tts_checkpoint

BUILD_S = 0.6
TICK_S = 0.02


def _slowed(cls: type) -> type:
    """``cls`` whose construction first takes ``BUILD_S`` of the constructing thread's time."""

    class Slow(cls):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(BUILD_S)
            super().__init__(*args, **kwargs)

    return Slow


async def _worst_tick_while(start: Callable[[], Awaitable[None]]) -> float:
    """The latest a ``TICK_S`` timer of this loop fired while ``start`` ran."""
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        loop = asyncio.get_running_loop()
        while not done.is_set():
            due = loop.time() + TICK_S
            await asyncio.sleep(TICK_S)
            worst = max(worst, loop.time() - due)

    ticking = asyncio.create_task(ticker())
    try:
        await start()
    finally:
        done.set()
        await ticking
    return worst


async def test_the_stt_engine_builds_its_batch_off_the_loop(
    config: ServerConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stt_engine, "SttFrameModel", _slowed(SttFrameModel))
    weights = write_stt_checkpoint(tmp_path / "stt").folder
    settings = config.stt_engine.model_copy(update={"weights": str(weights), "batch_size": 2})
    engine = stt_engine.KyutaiSttEngine(
        config.model_copy(update={"stt_engine": settings}), registry=CollectorRegistry()
    )
    try:
        worst = await _worst_tick_while(engine.start)
        assert engine.failure is None
        assert worst < BUILD_S / 2  # the loop went on serving while the batch was built
    finally:
        await engine.stop()


async def test_the_tts_engine_builds_its_batches_off_the_loop(
    config: ServerConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tts_engine, "KyutaiTTSModel", _slowed(KyutaiTTSModel))
    tiny = write_tts_checkpoint(tmp_path / "tts")
    update = {"weights": str(tiny.folder), "voices": str(tiny.voices), "max_sessions": 2, "young_batch": 2}
    settings = config.tts_engine.model_copy(update=update)
    engine = tts_engine.KyutaiTTSEngine(config.model_copy(update={"tts_engine": settings}))
    try:
        worst = await _worst_tick_while(engine.start)
        assert engine.ready, engine.failure
        assert worst < BUILD_S / 2
    finally:
        await engine.stop()
