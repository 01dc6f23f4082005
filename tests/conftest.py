"""Shared fixtures, and ``--engine-client``: the whole suite runs once with engines called
directly and once with them behind the engine link (as workers reach the engine process)."""

from __future__ import annotations

import gc
import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch

from rtserve import app
from rtserve.config import ServerConfig, load_config
from tests.support import release_middleware_cache


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine-client",
        choices=app.ENGINE_CLIENTS,
        default="local",
        help="how apps built by the tests reach their engines (default: local)",
    )


def pytest_configure(config: pytest.Config) -> None:
    app.engine_client = config.getoption("--engine-client")
    if importlib.util.find_spec("triton") and not torch.cuda.is_available():
        # Without a GPU the Triton kernels run in Triton's interpreter (test_paged_kv.py). triton.jit
        # reads this when it wraps a function, Triton's own helpers included, so it is set before
        # anything imports triton (torch.compile does).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    config.addinivalue_line(
        "markers",
        "engine_clock: steers the engine's tick clock by hand, which a worker's "
        "tick-aligned uplink cannot see across the link (skipped with --engine-client=link)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--engine-client") == "local":
        return
    skip = pytest.mark.skip(reason="holds the engine's tick clock; the link's uplink follows the real tick grid")
    for item in items:
        if "engine_clock" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    return f"engine client: {config.getoption('--engine-client')}"


@pytest.fixture
def config() -> ServerConfig:
    """Defaults only: the developer's environment must not leak into tests."""
    return load_config(environ={})


@pytest.fixture
def strict_fp32() -> Iterator[None]:
    """IEEE fp32 for cuBLAS matmuls and cuDNN convolutions (PyTorch lets cuDNN use TF32 by
    default), restored after the test so later ones keep the process's settings. Through the
    ``fp32_precision`` API: torch refuses to read the legacy ``allow_tf32`` flags once anything in
    the process has used the new one, so monkeypatching them fails on undo."""
    # ``cudnn.conv`` exists at run time (torch's module-replacement trick), but torch's annotations omit it.
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv  # type: ignore[attr-defined]
    saved = matmul.fp32_precision, conv.fp32_precision
    matmul.fp32_precision = conv.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved


@pytest.fixture(autouse=True)
def collect_sdk_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """An ``openai.AsyncOpenAI`` left unclosed sits in a reference cycle; when the collector finds
    it during a later test, the SDK schedules its ``aclose`` on that test's loop, which fails on
    the closed loop the client was made in and logs an asyncio error into the later test. Collect
    after each test that uses the SDK, while no loop runs, so the close is skipped instead. Only
    those modules: a full collection with torch loaded costs about 0.2 s."""
    yield
    if "openai" in vars(request.module):
        gc.collect()


@pytest.fixture(autouse=True, scope="module")
def release_stopped_apps() -> Iterator[None]:
    """After each module, nothing keeps the apps it served alive (tests/support.py)."""
    yield
    release_middleware_cache()
