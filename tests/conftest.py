"""Shared fixtures, and ``--engine-client``: the whole suite runs once with engines called
directly and once with them behind the engine link (as workers reach the engine process)."""

from __future__ import annotations

import pytest

from rtserve import app
from rtserve.config import ServerConfig, load_config


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--engine-client", choices=app.ENGINE_CLIENTS, default="local",
                     help="how apps built by the tests reach their engines (default: local)")


def pytest_configure(config: pytest.Config) -> None:
    app.engine_client = config.getoption("--engine-client")


def pytest_report_header(config: pytest.Config) -> str:
    return f"engine client: {config.getoption('--engine-client')}"


@pytest.fixture
def config() -> ServerConfig:
    """Defaults only: the developer's environment must not leak into tests."""
    return load_config(environ={})
