"""Wires the layers: config -> engines -> session core -> transports.

Every engine is built here (``engines.registry``) and started and stopped with the app;
the transports in ``web/`` reach them through the ``AppContext`` only.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import RobotConfig, ServerConfig
from rtserve.engines.policy.batcher import PolicyBatcher
from rtserve.engines.protocols import SessionEngine, TurnEngines
from rtserve.engines.registry import create_engine, create_text_engine, load_policy_batcher
from rtserve.engines.vllm_engine import VllmTextEngine
from rtserve.sessions import SessionManager
from rtserve.web import base_routes, http, moshi, openpi
from rtserve.web.realtime import routes as realtime
from rtserve.web.auth import auth_middleware
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.context import CTX, AppContext
from rtserve.web.errors import error_middleware

log = logging.getLogger(__name__)

_ENGINE_START = web.AppKey("engine_start", asyncio.Task)
_TEXT_ENGINE = web.AppKey("text_engine", VllmTextEngine)
_TEXT_ENGINE_START = web.AppKey("text_engine_start", asyncio.Task)


async def _start_engine(app: web.Application) -> None:
    ctx = app[CTX]
    try:
        await ctx.engine.start()
        log.info("engine %s ready", ctx.engine.capabilities.name)
    except Exception as exc:  # the server stays up and says why on /health
        ctx.engine_failure = f"{type(exc).__name__}: {exc}"
        log.exception("engine %s failed to start", ctx.engine.capabilities.name)


async def _start_text_engine(text_engine: VllmTextEngine) -> None:
    try:
        await text_engine.start()
    except Exception:  # chat keeps answering 503 model_not_ready; the log says why
        log.exception("vLLM text engine failed to start")


async def _load_policy(config: RobotConfig, registry: CollectorRegistry) -> PolicyBatcher | None:
    if config.policy == "none":
        return None
    try:
        batcher = await asyncio.to_thread(load_policy_batcher, config, registry)
    except Exception:
        log.exception("robot policy %r failed to load; the openpi route answers 'Robot policy not available'",
                      config.policy)
        return None
    batcher.start()
    log.info("robot policy %r ready (max_batch=%d, window=%.1f ms)", config.policy, config.max_batch,
             config.batch_window_ms)
    return batcher


async def _stop_policy(loading: asyncio.Task[PolicyBatcher | None]) -> None:
    loading.cancel()  # a cancelled wait leaves a still-running load thread to finish alone
    batcher = (await asyncio.gather(loading, return_exceptions=True))[0]
    if isinstance(batcher, PolicyBatcher):
        await asyncio.to_thread(batcher.stop)


async def _on_startup(app: web.Application) -> None:
    ctx = app[CTX]
    # Start in the background: /health answers 503 while models load.
    app[_ENGINE_START] = asyncio.create_task(_start_engine(app))
    if _TEXT_ENGINE in app:
        app[_TEXT_ENGINE_START] = asyncio.create_task(_start_text_engine(app[_TEXT_ENGINE]))
    ctx.policy_loading = asyncio.create_task(_load_policy(ctx.config.robot, ctx.registry))
    await ctx.sessions.start()  # the reaper: idle TTL, disconnect grace, cleanup retries


async def _close_sessions(app: web.Application) -> None:
    # Every session ends with session.closed{reason: "shutdown"} before the engine stops.
    await app[CTX].sessions.shutdown()


async def _on_cleanup(app: web.Application) -> None:
    ctx = app[CTX]
    if _TEXT_ENGINE in app:
        app[_TEXT_ENGINE_START].cancel()
        await asyncio.gather(app[_TEXT_ENGINE_START], return_exceptions=True)
        await app[_TEXT_ENGINE].stop()
    if ctx.policy_loading is not None:
        await _stop_policy(ctx.policy_loading)
    ctx.codecs.shutdown()
    app[_ENGINE_START].cancel()
    await asyncio.gather(app[_ENGINE_START], return_exceptions=True)
    await ctx.engine.stop()


def _turn_engines(engine: SessionEngine, text_engine: VllmTextEngine | None) -> TurnEngines:
    """The session engine's own models when it lends them (one copy for sessions and HTTP alike);
    a configured text engine replaces its LLM for chat."""
    lent = engine.turn_engines()
    return lent if text_engine is None else TurnEngines(asr=lent.asr, llm=text_engine, tts=lent.tts)


def build_app(config: ServerConfig, *, engine: SessionEngine | None = None,
              registry: CollectorRegistry | None = None) -> web.Application:
    registry = registry or CollectorRegistry()
    engine = engine or create_engine(config.engine, config, registry)
    text_engine = create_text_engine(config)
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(config.api_key)],
        client_max_size=config.transport.max_http_body_bytes,
    )
    if text_engine is not None:
        app[_TEXT_ENGINE] = text_engine
    sessions = SessionManager(engine, config.sessions, registry=registry)
    app[CTX] = AppContext(config=config, engine=engine, sessions=sessions,
                          codecs=CodecExecutor(config.transport.codec_threads), registry=registry,
                          turn_engines=_turn_engines(engine, text_engine))
    base_routes.setup(app)
    http.setup(app)
    openpi.setup(app)
    moshi.setup(app)
    realtime.setup(app)
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_on_cleanup)
    return app
