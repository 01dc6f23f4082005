"""Which requests are the public browser files: the page, the dashboard and their assets."""

from __future__ import annotations

from aiohttp import web

STATIC_PREFIX = "/static/"
PAGE_PATHS = frozenset({"/", "/dashboard"})


def is_page_request(request: web.Request) -> bool:
    """A plain GET of the page, the dashboard or one of their files. They hold no secret and a
    page load cannot carry a key, so they need none; what they call does (README "Browser page")."""
    if request.method not in ("GET", "HEAD") or request.headers.get("Upgrade", "").lower() == "websocket":
        return False
    return request.path in PAGE_PATHS or request.path.startswith(STATIC_PREFIX)
