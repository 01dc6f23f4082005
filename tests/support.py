"""Test support: run an aiohttp app on 127.0.0.1 with an ephemeral port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web, web_app

from rtserve.web.runner import app_runner


def release_middleware_cache() -> None:
    """Drop aiohttp's cache of built middleware chains (3.11 on: up to 1,024 entries keyed by the
    apps that served each request). It keeps every app the test process ever served alive, with its
    engines and models, after the app has stopped: the suite grew to ~16 GB resident. Each app is
    its own key, so clearing it costs the apps still serving one rebuild of a chain."""
    cached = getattr(web_app, "_cached_build_middleware", None)
    if cached is not None:
        cached.cache_clear()


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Yield the base URL (``http://127.0.0.1:PORT``) of ``app`` served on a real socket,
    under the same runner settings as ``rtserve serve``."""
    runner = app_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve_plain(app: web.Application) -> AsyncIterator[str]:
    """Yield the base URL of a plain aiohttp ``app`` (a stand-in for another server) on 127.0.0.1."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
