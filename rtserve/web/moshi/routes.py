"""Moshi / PersonaPlex-compatible routes on any frame engine, many callers at once.

``WS /api/chat`` (tagged binary frames, Ogg-Opus: ``chat``) and
``WS /v1/audio/duplex`` (JSON control + raw float32 PCM: ``duplex``) share one
``MoshiService``: admission (1013 when every slot is busy), metrics and
shutdown (every connection closed with 1001 and its engine slot released).
"""

from __future__ import annotations

from aiohttp import web

from rtserve.web.context import CTX
from rtserve.web.moshi import chat, duplex
from rtserve.web.moshi.metrics import MoshiMetrics
from rtserve.web.moshi.service import MoshiService

MOSHI = web.AppKey("moshi", MoshiService)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await chat.handle_chat(request, request.app[MOSHI])


async def _duplex(request: web.Request) -> web.StreamResponse:
    return await duplex.handle_duplex(request, request.app[MOSHI])


async def _on_shutdown(app: web.Application) -> None:
    await app[MOSHI].connections.close_all()


def setup(app: web.Application) -> None:
    ctx = app[CTX]
    app[MOSHI] = MoshiService(ctx.config, ctx.engine, MoshiMetrics(ctx.registry), ctx.sessions)
    app.router.add_get(chat.ROUTE, _chat)
    app.router.add_get(duplex.ROUTE, _duplex)
    app.on_shutdown.append(_on_shutdown)
