"""Optional API-key check on every route except liveness probes.

Accepted forms: ``Authorization: Bearer <key>`` (or ``Api-Key <key>``, what openpi-client
sends); the WebSocket subprotocol
``openai-insecure-api-key.<key>`` (browsers cannot set headers); ``?api_key=<key>``.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from rtserve.web.errors import error_response

SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
EXEMPT_PATHS = frozenset({"/health", "/healthz"})


def presented_keys(request: web.Request) -> list[str]:
    keys = []
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() in ("bearer", "api-key"):
        keys.append(credential.strip())
    for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith(SUBPROTOCOL_PREFIX):
            keys.append(proto[len(SUBPROTOCOL_PREFIX):])
    if "api_key" in request.query:
        keys.append(request.query["api_key"])
    return keys


def is_authorized(request: web.Request, api_key: str) -> bool:
    return any(hmac.compare_digest(k.encode(), api_key.encode()) for k in presented_keys(request))


def auth_middleware(api_key: str | None):
    @web.middleware
    async def check(request: web.Request, handler):
        if api_key is None or request.path in EXEMPT_PATHS or is_authorized(request, api_key):
            return await handler(request)
        if request.headers.get("Upgrade", "").lower() == "websocket":
            # Browsers cannot read an HTTP 401 on a WebSocket upgrade: accept, then close 4001.
            ws = web.WebSocketResponse(protocols=("realtime",))
            await ws.prepare(request)
            await ws.close(code=4001, message=b"invalid api key")
            return ws
        return error_response("Invalid or missing API key", status=401, code="invalid_api_key")

    return check
