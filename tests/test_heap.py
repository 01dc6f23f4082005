"""The engine process keeps what it loaded out of garbage collections (rtserve/heap.py)."""

from __future__ import annotations

import asyncio
import gc

from prometheus_client import CollectorRegistry

from rtserve.config import RobotConfig, ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.heap import freeze_when_ready


async def test_the_heap_is_frozen_once_the_robot_policy_has_loaded_not_before() -> None:
    """The session engine is ready before the policy (and torch with it) finishes loading in a
    thread; a freeze then would leave that import for every full collection to walk."""
    engines = EngineSet(ServerConfig(engine="loopback", robot=RobotConfig(policy="demo")), CollectorRegistry())
    engines.start()
    freeze_when_ready(engines)
    try:
        async with asyncio.timeout(60):
            while not engines.ready or engines.policy_loading:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0)  # the policy's done-callback, which freezes, runs in this turn
        assert gc.get_freeze_count() > 50_000
        assert len(gc.get_objects()) < 10_000  # what a full collection still walks
    finally:
        gc.unfreeze()  # the test process's later collections must see everything again
        await engines.stop()
