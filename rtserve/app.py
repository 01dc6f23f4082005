"""Wires the layers: config -> engine -> session core -> transports."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.protocols import SessionEngine
from rtserve.engines.registry import create_engine
from rtserve.sessions import SessionManager
from rtserve.web import base_routes, http, moshi, openpi, realtime
from rtserve.web.auth import auth_middleware
from rtserve.web.context import CTX, AppContext
from rtserve.web.errors import error_middleware

log = logging.getLogger(__name__)

_ENGINE_START = web.AppKey("engine_start", asyncio.Task)


async def _start_engine(app: web.Application) -> None:
    ctx = app[CTX]
    try:
        await ctx.engine.start()
        log.info("engine %s ready", ctx.engine.capabilities.name)
    except Exception as exc:  # the server stays up and says why on /health
        ctx.engine_failure = f"{type(exc).__name__}: {exc}"
        log.exception("engine %s failed to start", ctx.engine.capabilities.name)


async def _on_startup(app: web.Application) -> None:
    # Start in the background: /health answers 503 while models load.
    app[_ENGINE_START] = asyncio.create_task(_start_engine(app))
    await app[CTX].sessions.start()  # the reaper: idle TTL, disconnect grace, cleanup retries


async def _close_sessions(app: web.Application) -> None:
    # Every session ends with session.closed{reason: "shutdown"} before the engine stops.
    await app[CTX].sessions.shutdown()


async def _on_cleanup(app: web.Application) -> None:
    app[_ENGINE_START].cancel()
    await asyncio.gather(app[_ENGINE_START], return_exceptions=True)
    await app[CTX].engine.stop()


def build_app(config: ServerConfig, *, engine: SessionEngine | None = None,
              registry: CollectorRegistry | None = None) -> web.Application:
    registry = registry or CollectorRegistry()
    engine = engine or create_engine(config.engine, config, registry)
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(config.api_key)],
        client_max_size=config.transport.max_http_body_bytes,
    )
    sessions = SessionManager(engine, config.sessions, registry=registry)
    app[CTX] = AppContext(config=config, engine=engine, sessions=sessions, registry=registry)
    base_routes.setup(app)
    http.setup(app)
    openpi.setup(app)
    moshi.setup(app)
    realtime.setup(app)
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_on_cleanup)
    return app
