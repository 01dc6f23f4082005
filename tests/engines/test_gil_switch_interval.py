"""A process that runs engines hands the GIL to a waiting engine thread after
``lockstep.gil_switch_interval_ms``, not Python's 5 ms (rtserve/engines/engine_set.py)."""

from __future__ import annotations

import sys

from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig, ServerConfig
from rtserve.engines.engine_set import EngineSet


async def test_starting_the_engines_sets_the_configured_switch_interval() -> None:
    saved = sys.getswitchinterval()
    config = ServerConfig(engine="loopback", lockstep=LockstepConfig(gil_switch_interval_ms=0.25))
    engines = EngineSet(config, CollectorRegistry())
    try:
        engines.start()
        assert sys.getswitchinterval() == 0.00025
    finally:
        await engines.stop()
        sys.setswitchinterval(saved)
