"""Optional API-key check on every route except liveness probes and the browser files.

The browser page, dashboard and their files are public (``is_page_request``): a page load
cannot carry a key, and they hold none; what they call asks for one.

Accepted forms: ``Authorization: Bearer <key>`` (or ``Api-Key <key>``, what openpi-client
sends); the WebSocket subprotocol
``openai-insecure-api-key.<key>`` (browsers cannot set headers); ``?api_key=<key>``; and
moshi-server's forms, so Kyutai's clients connect unchanged: the ``kyutai-api-key`` header and
``?auth_id=<key>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from rtserve.errors import INVALID_API_KEY
from rtserve.web.browser.paths import is_page_request
from rtserve.web.errors import error_response
from rtserve.web.subprotocols import key_subprotocols, subprotocol_keys

EXEMPT_PATHS = frozenset({"/health", "/healthz"})


def presented_keys(request: web.Request) -> list[str]:
    keys = []
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() in ("bearer", "api-key"):
        keys.append(credential.strip())
    keys.extend(subprotocol_keys(request))
    if "kyutai-api-key" in request.headers:
        keys.append(request.headers["kyutai-api-key"])
    for name in ("api_key", "auth_id"):
        if name in request.query:
            keys.append(request.query[name])
    return keys


def is_authorized(request: web.Request, api_key: str) -> bool:
    # aiohttp keeps header bytes that are not UTF-8 as surrogates: compare those bytes as they came.
    return any(
        hmac.compare_digest(k.encode("utf-8", "surrogateescape"), api_key.encode()) for k in presented_keys(request)
    )


def auth_middleware(api_key: str | None, also_admits: Callable[[web.Request], bool] | None = None) -> Middleware:
    """``also_admits``: a second check for requests the key did not admit (a client secret
    may place a WebRTC call, ``web/webrtc/client_secrets.py``)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            api_key is None
            or request.path in EXEMPT_PATHS
            or is_page_request(request)
            or is_authorized(request, api_key)
            or (also_admits is not None and also_admits(request))
        ):
            return await handler(request)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            # Browsers cannot read an HTTP 401 on a WebSocket upgrade: accept, then close 4001.
            ws = web.WebSocketResponse(protocols=("realtime", *key_subprotocols(request)))
            await ws.prepare(request)
            await ws.close(code=4001, message=b"invalid api key")
            return ws
        return error_response("Invalid or missing API key", status=401, code=INVALID_API_KEY)

    return check
