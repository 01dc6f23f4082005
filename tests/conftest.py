"""Shared fixtures."""

from __future__ import annotations

import pytest

from rtserve.config import ServerConfig, load_config


@pytest.fixture
def config() -> ServerConfig:
    """Defaults only: the developer's environment must not leak into tests."""
    return load_config(environ={})
