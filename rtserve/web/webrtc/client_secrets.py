"""``POST /v1/realtime/client_secrets``: short-lived keys that can only place calls.

OpenAI's browser flow: the application's backend, holding the real API key, mints a client
secret (``ek_...``, ``expires_at``) and hands it to the page, which places its WebRTC call
with it; the real key never reaches the browser. Here the secret admits exactly one route,
``POST /v1/realtime/calls``, until it expires (``expires_after.seconds``, default
``webrtc.client_secret_ttl_s``, at most ``webrtc.client_secret_max_ttl_s``); the session
object given when minting is bound into it and is what calls placed with it start from.

Secrets are signed, not stored: the value carries its expiry and session, with an HMAC
keyed by ``webrtc.client_secret_keys`` (the first signs, every one verifies, so keys rotate
without refusing secrets already handed out), so every front-end worker (``--workers N``)
accepts the same secrets and nothing accumulates. The key is never derived from the API
key: a secret's holder could otherwise test API-key guesses against it offline. Unset, it is
random per server start (a restart refuses earlier secrets) or, in a Ray cluster, derived
from the cluster secret every front-end shares.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from rtserve import errors
from rtserve.config import ServerConfig
from rtserve.web.auth import presented_keys
from rtserve.web.errors import ApiError

PREFIX = "ek_"
CALLS_ROUTE = "/v1/realtime/calls"
_MIN_TTL_S = 10  # OpenAI's lower bound on expires_after.seconds


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class ClientSecret:
    value: str
    expires_at: int
    session: dict[str, Any] | None


class ClientSecrets:
    def __init__(self, config: ServerConfig, clock: Callable[[], float] = time.time) -> None:
        self._settings = config.webrtc
        self._keys = [key.encode("utf-8", "surrogateescape") for key in config.webrtc.client_secret_keys]
        self.clock = clock  # wall time (expires_at is seconds since the epoch)

    def mint(self, body: dict[str, Any]) -> ClientSecret:
        """A secret for the request ``body`` (``expires_after``, ``session``); 400 on bad values."""
        ttl = self._ttl(body.get("expires_after"))
        session = body.get("session")
        if session is not None and not isinstance(session, dict):
            raise ApiError("'session' must be an object.", code=errors.INVALID_VALUE, param="session")
        expires_at = int(self.clock()) + ttl
        payload = json.dumps(
            {"exp": expires_at, "session": session, "n": secrets.token_hex(8)}, separators=(",", ":")
        ).encode()
        if session is not None and len(payload) > self._settings.max_client_secret_session_bytes:
            raise ApiError(
                f"'session' is too large to bind into a client secret (at most "
                f"{self._settings.max_client_secret_session_bytes} bytes).",
                code=errors.INVALID_VALUE,
                param="session",
            )
        body64 = _b64(payload)
        return ClientSecret(f"{PREFIX}{body64}.{self._sign(body64, self._keys[0])}", expires_at, session)

    def verify(self, value: str) -> ClientSecret | None:
        """The secret ``value`` names, if it is genuine and unexpired."""
        if not value.startswith(PREFIX) or value.count(".") != 1 or not value.isascii():
            return None
        body64, signature = value[len(PREFIX) :].split(".")
        if not any(hmac.compare_digest(signature.encode(), self._sign(body64, key).encode()) for key in self._keys):
            return None
        payload = json.loads(_unb64(body64))
        if payload["exp"] <= self.clock():
            return None
        return ClientSecret(value, payload["exp"], payload["session"])

    def presented(self, request: web.Request) -> ClientSecret | None:
        """A valid secret the request presents, if any."""
        for key in presented_keys(request):
            if key.startswith(PREFIX) and (secret := self.verify(key)) is not None:
                return secret
        return None

    def admits(self, request: web.Request) -> bool:
        """For the auth middleware: a request the server's API key did not admit may still
        place a call with a valid secret; nothing else."""
        return request.method == "POST" and request.path == CALLS_ROUTE and self.presented(request) is not None

    @staticmethod
    def _sign(body64: str, key: bytes) -> str:
        return _b64(hmac.new(key, body64.encode(), hashlib.sha256).digest())

    def _ttl(self, expires_after: Any) -> int:
        if expires_after is None:
            return self._settings.client_secret_ttl_s
        if not isinstance(expires_after, dict) or expires_after.get("anchor", "created_at") != "created_at":
            raise ApiError(
                'expires_after must be {"anchor": "created_at", "seconds": N}.',
                code=errors.INVALID_VALUE,
                param="expires_after",
            )
        seconds = expires_after.get("seconds", self._settings.client_secret_ttl_s)
        limit = self._settings.client_secret_max_ttl_s
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not _MIN_TTL_S <= seconds <= limit:
            raise ApiError(
                f"expires_after.seconds must be an integer from {_MIN_TTL_S} to {limit}.",
                code=errors.INVALID_VALUE,
                param="expires_after.seconds",
            )
        return seconds
