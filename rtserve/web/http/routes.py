"""Registers the HTTP generation routes and their shared concurrency limit.

The turn engines behind them (``AppContext.turn_engines``) are built and run by the app.
"""

from __future__ import annotations

from aiohttp import web

from rtserve.web.context import CTX
from rtserve.web.http import chat, sleep, speech, speech_batch, speech_stream, tokenize, transcriptions, voices
from rtserve.web.http.common import LIMITER, GenerationLimiter


def setup(app: web.Application) -> None:
    ctx = app[CTX]
    app[LIMITER] = GenerationLimiter(ctx.config.transport.max_concurrent_http_generations, ctx.registry)
    chat.setup(app)
    tokenize.setup(app)
    speech.setup(app)
    transcriptions.setup(app)
    speech_batch.setup(app)
    speech_stream.setup(app)
    voices.setup(app)
    sleep.setup(app)
