"""Loaded cascade models, shared by every model test of this folder (loading costs seconds).

The engine uses the default model locations (the shipped wheels) and the default
converted-model cache, so only the first run on a machine pays for the GGUF conversion.
Threads of the engine are independent of event loops, so one engine serves every test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from cascade_support import MAX_SESSIONS, QUESTION, Loaded, speak_16k
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade import CascadeEngine


@pytest.fixture(scope="session")
def cascade() -> Iterator[Loaded]:
    config = load_config(environ={}, overrides={"sessions": {"max_sessions": MAX_SESSIONS}})
    registry = CollectorRegistry()
    engine = CascadeEngine(config, registry)
    asyncio.run(engine.start())
    yield Loaded(engine, registry)
    asyncio.run(engine.stop())


@pytest.fixture(scope="session")
def question_16k(cascade: Loaded) -> np.ndarray:
    return asyncio.run(speak_16k(cascade.engine, QUESTION))
