"""An engine that a route package owns (the Kyutai STT and TTS engines behind their
moshi-server routes, the image and video engines): it starts loading with the app, in the
background so the server listens at once (its route refuses streams until it serves), and stops
after the route's sockets have closed, once a start still under way has settled. ``/health``
reports each one (``route_engines``)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web


class RouteEngine(Protocol):
    @property
    def ready(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


ROUTE_ENGINES = web.AppKey("route_engines", dict[str, RouteEngine])


def route_engines(app: web.Application) -> dict[str, RouteEngine]:
    """The engines this app's routes own, by name."""
    return app.get(ROUTE_ENGINES, {})


def run_with_app(app: web.Application, engine: RouteEngine, name: str) -> None:
    """Start ``engine`` with ``app`` and stop it in the app's cleanup."""
    app.setdefault(ROUTE_ENGINES, {})[name] = engine
    starting: list[asyncio.Task[None]] = []

    async def start(_: web.Application) -> None:
        starting.append(asyncio.create_task(engine.start(), name=f"{name}-engine-start"))

    async def stop(_: web.Application) -> None:
        await asyncio.gather(*starting, return_exceptions=True)  # its failure was reported by the engine
        await engine.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
