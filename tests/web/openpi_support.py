"""Shared by the openpi route tests: the real app on 127.0.0.1 with a chosen robot config."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.web.openpi.routes import ROUTE
from tests.support import serve_app


@contextlib.asynccontextmanager
async def openpi_server(config: ServerConfig, **robot: object) -> AsyncIterator[tuple[str, str]]:
    """Serve ``build_app`` (weightless ``loopback`` realtime engine) with ``config.robot``
    fields overridden; yield (http base URL, openpi WebSocket URL)."""
    config = config.model_copy(update={"engine": "loopback",
                                       "robot": config.robot.model_copy(update=robot)})
    async with serve_app(build_app(config)) as base:
        yield base, base.replace("http://", "ws://") + ROUTE
