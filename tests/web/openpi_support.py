"""Shared by the openpi route tests: the real app on 127.0.0.1 with a chosen robot config,
and a policy that fails on demand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import yarl

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.policy.demo import PROMPT, DemoDroidPolicy
from rtserve.web.openpi.routes import ROUTE
from tests.support import serve_app

SECRET = "/secret/path/model.py:42"


class ExplodingPolicy(DemoDroidPolicy):
    """The demo policy, except that it raises on prompts containing 'explode'."""

    def infer(self, batch):
        if any("explode" in request.observation[PROMPT] for request in batch):
            raise RuntimeError(f"CUDA error at {SECRET}")
        return super().infer(batch)


def exploding_policy() -> ExplodingPolicy:
    return ExplodingPolicy()


EXPLODING = f"{__name__}:exploding_policy"


def host_port(base: str) -> tuple[str, int]:
    """``http://127.0.0.1:PORT`` -> ("127.0.0.1", PORT), as a robot would pass them."""
    url = yarl.URL(base)
    assert url.host is not None and url.port is not None
    return url.host, url.port


@contextlib.asynccontextmanager
async def openpi_server(config: ServerConfig, **robot: object) -> AsyncIterator[tuple[str, str]]:
    """Serve ``build_app`` (weightless ``loopback`` realtime engine) with ``config.robot``
    fields overridden; yield (http base URL, openpi WebSocket URL)."""
    config = config.model_copy(update={"engine": "loopback", "robot": config.robot.model_copy(update=robot)})
    async with serve_app(build_app(config)) as base:
        yield base, base.replace("http://", "ws://") + ROUTE
