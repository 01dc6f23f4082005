"""Loaded cascade models, shared by every model test of this folder (loading costs seconds) and
released after its last one (the folder is a package, so package scope ends there: ~2.8 GB).

The engine uses the default model locations (the shipped wheels) and the default
converted-model cache, so only the first run on a machine pays for the GGUF conversion.
Threads of the engine are independent of event loops, so one engine serves every test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.llm import SmolLlm
from rtserve.engines.cascade.llm_batched import BatchedLlm
from rtserve.engines.cascade.llm_ct2 import Ct2Llm
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.llm_stage import LlmStage
from rtserve.engines.cascade.metrics import CascadeMetrics
from tests.engines.cascade.cascade_support import MAX_SESSIONS, QUESTION, Float32Ct2, Loaded, speak_16k


@pytest.fixture(scope="package")
def cascade() -> Iterator[Loaded]:
    config = load_config(environ={}, overrides={"sessions": {"max_sessions": MAX_SESSIONS}})
    registry = CollectorRegistry()
    engine = CascadeEngine(config, registry)
    asyncio.run(engine.start())
    yield Loaded(engine, registry)
    asyncio.run(engine.stop())


@pytest.fixture(scope="package")
def question_16k(cascade: Loaded) -> np.ndarray:
    return asyncio.run(speak_16k(cascade.engine, QUESTION))


@pytest.fixture(scope="package")
def transformers_llm(cascade: Loaded) -> SmolLlm:
    """The transformers runtime over the engine's model: the engine's own LLM stage when
    configured so, else the one the CTranslate2 stage hands function calls to."""
    llm = cascade.engine.llm
    if isinstance(llm, Ct2Llm):
        return asyncio.run(llm.constrained())
    assert isinstance(llm, SmolLlm)
    return llm


@pytest.fixture(scope="package")
def batched_llm(cascade: Loaded) -> Iterator[BatchedLlm]:
    """transformers' continuous batching over the shipped model (on the CPU here), counting into
    the engine's metrics like the engine's own LLM."""
    config = load_config(environ={}, overrides={"cascade": {"llm_runtime": "transformers_batched"}})
    llm = create_llm(config, cascade.engine._metrics)
    assert isinstance(llm, BatchedLlm)
    asyncio.run(llm.start())
    yield llm
    llm.stop()


@pytest.fixture(params=["ctranslate2", "transformers", "transformers_batched"])
def llm(request: pytest.FixtureRequest, cascade: Loaded) -> LlmStage:
    """Each runtime (``cascade.llm_runtime``) over the shipped model, same limits."""
    if request.param == "transformers":
        return request.getfixturevalue("transformers_llm")
    if request.param == "transformers_batched":
        return request.getfixturevalue("batched_llm")
    assert isinstance(cascade.engine.llm, Ct2Llm)  # the default
    return cascade.engine.llm


@pytest.fixture(scope="package")
def float32_ct2() -> Iterator[Float32Ct2]:
    """CTranslate2 on float32 weights: batch-invariant, so batching can be checked token for token.
    (int8 quantizes activations with kernels whose rounding depends on the batch's shape: a
    greedy reply may take another near-tie token when decoded in a batch, alone or resumed.)"""
    config = load_config(environ={}, overrides={"cascade": {"llm_compute_type": "float32"}})
    registry = CollectorRegistry()
    llm = create_llm(config, CascadeMetrics(registry))
    assert isinstance(llm, Ct2Llm)
    asyncio.run(llm.start())
    yield Float32Ct2(llm, registry)
    llm.stop()


@pytest.fixture(params=["ctranslate2-float32", "transformers", "transformers_batched"])
def exact_llm(request: pytest.FixtureRequest) -> LlmStage:
    """A runtime whose greedy text does not depend on what else is decoded with it."""
    if request.param == "transformers":
        return request.getfixturevalue("transformers_llm")
    if request.param == "transformers_batched":
        return request.getfixturevalue("batched_llm")
    return request.getfixturevalue("float32_ct2").llm
