"""An engine that a route package owns (the Kyutai STT and TTS engines behind their
moshi-server routes): it starts loading with the app, in the background so the server
listens at once (its route refuses streams until it serves), and stops after the route's
sockets have closed, once a start still under way has settled."""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiohttp import web


class RouteEngine(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def run_with_app(app: web.Application, engine: RouteEngine, name: str) -> None:
    """Start ``engine`` with ``app`` and stop it in the app's cleanup."""
    starting: list[asyncio.Task[None]] = []

    async def start(_: web.Application) -> None:
        starting.append(asyncio.create_task(engine.start(), name=f"{name}-engine-start"))

    async def stop(_: web.Application) -> None:
        await asyncio.gather(*starting, return_exceptions=True)  # its failure was reported by the engine
        await engine.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
