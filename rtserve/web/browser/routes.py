"""Registers ``GET /`` (the voice chat page), ``GET /dashboard`` and ``GET /static/*``.

A WebSocket upgrade at ``/`` stays the openpi robot route (openpi-client connects to
``/``, see ``web/openpi``); only a plain GET gets the page. The files are package data
(``web/static/*`` in pyproject), served as they are. Every answer carries a
Content-Security-Policy that allows only this origin: the page and dashboard fetch nothing
from anywhere else, so a script injected into them could not either.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from rtserve.web.browser.paths import STATIC_PREFIX
from rtserve.web.openpi.routes import openpi_socket

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
_SHIPPED = frozenset(p.name for p in STATIC_DIR.iterdir() if p.is_file())

# 'self' covers ws:/wss: of this origin (CSP level 3). blob: for the played-back audio element.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "media-src 'self' blob: mediastream:; connect-src 'self'; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _file(name: str) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / name, headers=_HEADERS)


async def root(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await openpi_socket(request)
    return _file("index.html")


async def dashboard(request: web.Request) -> web.StreamResponse:
    return _file("dashboard.html")


async def static_file(request: web.Request) -> web.StreamResponse:
    # Only the files the package ships, by exact name: no path is ever built from the URL.
    name = request.match_info["name"]
    if name not in _SHIPPED:
        raise web.HTTPNotFound()
    return _file(name)


def setup(app: web.Application) -> None:
    app.router.add_get("/", root)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_get(STATIC_PREFIX + "{name}", static_file)
