"""Registers ``WS /v1/realtime`` and ``WS /v1/duplex`` on the app's ``RealtimeService``."""

from __future__ import annotations

from aiohttp import web

from rtserve.web.context import CTX
from rtserve.web.realtime.dialect import DUPLEX_ROUTE, REALTIME_ROUTE
from rtserve.web.realtime.service import RealtimeService

SERVICE = web.AppKey("realtime", RealtimeService)


async def _realtime(request: web.Request) -> web.StreamResponse:
    return await request.app[SERVICE].handle(request, REALTIME_ROUTE)


async def _duplex(request: web.Request) -> web.StreamResponse:
    return await request.app[SERVICE].handle(request, DUPLEX_ROUTE)


async def _on_shutdown(app: web.Application) -> None:
    await app[SERVICE].connections.close_all()


def setup(app: web.Application) -> None:
    ctx = app[CTX]
    app[SERVICE] = RealtimeService(ctx.config, ctx.sessions, ctx.engine.capabilities, ctx.codecs, ctx.registry)
    app[SERVICE].asr = lambda: ctx.turn_engines.asr
    app.router.add_get(REALTIME_ROUTE, _realtime)
    app.router.add_get(DUPLEX_ROUTE, _duplex)
    app.on_shutdown.append(_on_shutdown)
