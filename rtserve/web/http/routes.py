"""Registers the HTTP generation routes and wires the turn engines behind them.

Turn engines come from two places (``AppContext.turn_engines``):

* the session engine, when it lends its own loaded models (``TurnEngineProvider``), so the
  server holds one copy of each model for realtime sessions and HTTP alike;
* ``http.text_engine: vllm``: a vLLM engine replaces the LLM for chat; it is started with
  the app and stopped at shutdown.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from rtserve.config import ServerConfig
from rtserve.engines.protocols import SessionEngine, TurnEngineProvider
from rtserve.web.context import CTX, TurnEngines
from rtserve.web.http import chat, speech, transcriptions
from rtserve.web.http.common import LIMITER, GenerationLimiter

log = logging.getLogger(__name__)

_TEXT_ENGINE_START = web.AppKey("text_engine_start", asyncio.Task)


def setup(app: web.Application) -> None:
    ctx = app[CTX]
    ctx.turn_engines = _turn_engines(ctx.config, ctx.engine, app)
    app[LIMITER] = GenerationLimiter(ctx.config.transport.max_concurrent_http_generations, ctx.registry)
    chat.setup(app)
    speech.setup(app)
    transcriptions.setup(app)


def _turn_engines(config: ServerConfig, engine: SessionEngine, app: web.Application) -> TurnEngines:
    lent = (TurnEngines(asr=engine.asr, llm=engine.llm, tts=engine.tts)
            if isinstance(engine, TurnEngineProvider) else TurnEngines())
    if config.http.text_engine == "session":
        return lent
    from rtserve.engines.vllm_engine import VllmTextEngine  # vLLM itself is imported only at start

    text_engine = VllmTextEngine(config.http.vllm)  # ConfigError here when vllm is missing

    async def start(app: web.Application) -> None:
        async def run() -> None:
            try:
                await text_engine.start()
            except Exception:  # chat keeps answering 503 model_not_ready; the log says why
                log.exception("vLLM text engine failed to start")

        app[_TEXT_ENGINE_START] = asyncio.create_task(run())

    async def stop(app: web.Application) -> None:
        app[_TEXT_ENGINE_START].cancel()
        await asyncio.gather(app[_TEXT_ENGINE_START], return_exceptions=True)
        await text_engine.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return TurnEngines(asr=lent.asr, llm=text_engine, tts=lent.tts)
