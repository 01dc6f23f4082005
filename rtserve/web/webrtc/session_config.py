"""The session a call opens with: OpenAI's defaults (server VAD when the engine has one),
then the session bound into the client secret that placed the call, then the call's own
``session`` part. A bad object is a 400 naming the field, before any peer connection exists."""

from __future__ import annotations

from typing import Any

from rtserve.config import SessionLimits
from rtserve.engines.values import EngineCapabilities
from rtserve.errors import RtserveError
from rtserve.sessions import SessionConfig, TurnDetection
from rtserve.sessions.session_config import ConfigUpdateError
from rtserve.web.errors import ApiError
from rtserve.web.realtime.session_object import session_changes


def call_config(
    sessions: list[dict[str, Any] | None], capabilities: EngineCapabilities, limits: SessionLimits
) -> SessionConfig:
    vad = capabilities.supports_server_vad
    config = SessionConfig(turn_detection=TurnDetection() if vad else None)
    for session in sessions:
        if session is None:
            continue
        try:
            config = config.updated(session_changes(session, supports_server_vad=vad), limits)
        except ConfigUpdateError as exc:
            raise ApiError(exc.message, code=exc.code, param=f"session.{exc.param}") from None
        except RtserveError as exc:  # the session object's own validation (WireError)
            raise ApiError(exc.message, code=exc.code, param=exc.param or "session") from None
    return config
