"""The engine process keeps what it loaded out of garbage collections (rtserve/heap.py)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rtserve import heap
from rtserve.config import RobotConfig, ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.heap import freeze_when_ready
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint


async def test_the_heap_is_frozen_once_the_robot_policy_has_loaded_not_before() -> None:
    """The session engine is ready before the policy (and torch with it) finishes loading in a
    thread; a freeze then would leave that import for every full collection to walk."""
    engines = EngineSet(ServerConfig(engine="loopback", robot=RobotConfig(policy="demo")), CollectorRegistry())
    engines.start()
    freeze_when_ready(engines)
    try:
        async with asyncio.timeout(60):
            while not engines.settled:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0)  # the policy's done-callback, which freezes, runs in this turn
        assert gc.get_freeze_count() > 50_000
        assert len(gc.get_objects()) < 10_000  # what a full collection still walks
    finally:
        gc.unfreeze()  # the test process's later collections must see everything again
        await engines.stop()


async def test_the_heap_is_frozen_once_a_kyutai_stt_beside_a_loopback_engine_has_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loopback session engine is ready at once, the STT engine loads its model on a thread
    after: a freeze before that left the model for every full collection to walk."""
    weights = write_stt_checkpoint(tmp_path / "weights").folder
    config = ServerConfig(engine="loopback")
    config.stt_engine = config.stt_engine.model_copy(update={"weights": str(weights), "batch_size": 2})
    engines = EngineSet(config, CollectorRegistry())
    assert engines.stt_engine is not None
    stt_ready_at_freeze: list[bool] = []
    monkeypatch.setattr(heap, "freeze_long_lived", lambda: stt_ready_at_freeze.append(engines.stt_engine.ready))
    engines.start()
    freeze_when_ready(engines)
    try:
        async with asyncio.timeout(120):
            while not engines.settled:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0)
        assert engines.ready and stt_ready_at_freeze == [True]
    finally:
        await engines.stop()
