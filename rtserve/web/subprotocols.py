"""The ``Sec-WebSocket-Protocol`` offers of an upgrade request, read in one place.

Browsers cannot set headers on a WebSocket, so OpenAI's clients send their API key as the
subprotocol ``openai-insecure-api-key.<key>``; every WebSocket route answers one of those
offers (a browser fails a handshake that answers none of its offers), the auth check reads
the key from it, and a relay to another front-end drops it.
"""

from __future__ import annotations

from aiohttp import web

API_KEY_PREFIX = "openai-insecure-api-key."


def offered_subprotocols(request: web.Request) -> list[str]:
    header = request.headers.get("Sec-WebSocket-Protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def is_key_subprotocol(protocol: str) -> bool:
    return protocol.startswith(API_KEY_PREFIX)


def key_subprotocols(request: web.Request) -> tuple[str, ...]:
    """The key-form subprotocols the client offered. Every WebSocket route declares them: a
    browser fails a handshake that answers none of its offers, and aiohttp logs unanswered
    offers at WARNING, key included."""
    return tuple(p for p in offered_subprotocols(request) if is_key_subprotocol(p))


def subprotocol_keys(request: web.Request) -> list[str]:
    """The API keys carried in the client's subprotocol offers."""
    return [p.removeprefix(API_KEY_PREFIX) for p in key_subprotocols(request)]
