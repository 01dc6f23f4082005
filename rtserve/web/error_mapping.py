"""How an ``RtserveError`` looks on each wire: one function per wire, nowhere else.

Every layer raises an ``RtserveError`` (``message``, stable ``code``, optional ``param``);
the transports call these to render it, so a code means the same thing on every route:

* OpenAI HTTP error body -> ``api_error`` (status and ``param`` by code; docs/serving.md#errors);
* OpenAI Realtime ``error`` event -> ``realtime_error`` (``error.type`` by context, the
  field at fault as the client spelled it);
* WebSocket close code (Moshi routes, a refused realtime open) -> ``close_code``;
* openpi error frame -> ``openpi_error_frame``; Moshi duplex ``error`` message ->
  ``moshi_error_message``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import WSCloseCode

from rtserve import errors
from rtserve.codecs.errors import CodecError
from rtserve.errors import RtserveError
from rtserve.sessions.session_config import ConfigUpdateError
from rtserve.web.errors import ApiError
from rtserve.web.realtime.errors import INVALID_BASE64_MESSAGE, WireError

# ---------------------------------------------------------------------------
# OpenAI HTTP
# ---------------------------------------------------------------------------

# HTTP status and the request field concerned, by code. Any other code is a 500 ``server_error``.
_HTTP_BY_CODE: dict[str, tuple[int, str | None]] = {
    errors.INVALID_VALUE: (400, None),
    errors.MALFORMED_REQUEST: (400, None),
    errors.INVALID_AUDIO: (400, "file"),
    errors.INVALID_VOICE: (400, "voice"),
    errors.UNSUPPORTED_LANGUAGE: (400, "language"),
    errors.CONTEXT_LENGTH_EXCEEDED: (400, "messages"),
    errors.RESOURCE_EXHAUSTED: (429, None),
    errors.MODEL_NOT_READY: (503, None),
    errors.MODEL_UNAVAILABLE: (503, None),
    errors.ENGINE_SLEEPING: (503, None),
    errors.ENGINE_UNAVAILABLE: (503, None),  # the engine process or actor is gone; it is being restarted
    errors.STAGE_BUSY: (409, None),
    errors.SLEEP_UNSUPPORTED: (400, None),
    errors.REQUEST_TOO_LARGE: (413, None),
    errors.VOICE_EXISTS: (409, "name"),
    errors.VOICE_NOT_FOUND: (404, "name"),
    errors.VOICE_NOT_DELETABLE: (400, "name"),
    errors.VOICE_LIMIT_EXCEEDED: (400, None),
    errors.INVALID_VOICE_MODEL: (400, "model"),
    errors.VOICE_REGISTRATION_UNSUPPORTED: (400, None),
    errors.VOICE_MODEL_REJECTED: (422, "model"),
    errors.SPEECH_TOO_LONG: (422, "input"),
    errors.TOKENIZE_UNSUPPORTED: (501, None),
}


def api_error(exc: RtserveError) -> ApiError:
    """``exc`` as an OpenAI-shaped HTTP error (``.response()`` or ``.body()`` renders it)."""
    if isinstance(exc, ApiError):
        return exc
    status, param = _HTTP_BY_CODE.get(exc.code, (500, None))
    return ApiError(
        exc.message,
        status=status,
        code=exc.code,
        param=exc.param or param,
        type_=errors.SERVER_ERROR if status >= 500 else None,
    )


# ---------------------------------------------------------------------------
# OpenAI Realtime ``error`` event
# ---------------------------------------------------------------------------


def realtime_error(exc: RtserveError, *, event_id: str | None = None, opening: bool = False) -> WireError:
    """``exc`` as the realtime wire's error (``RealtimeConnection._report`` sends it).

    ``opening``: ``exc`` refused opening a session, which is the server's condition
    (``rate_limit_error`` when full, else ``server_error``), not a bad request."""
    if isinstance(exc, WireError):
        return exc
    if isinstance(exc, CodecError):  # raised decoding an append's ``audio``
        message = INVALID_BASE64_MESSAGE if exc.code == errors.INVALID_BASE64 else exc.message
        return WireError(exc.code, message, param="audio", event_id=event_id)
    if isinstance(exc, ConfigUpdateError):
        return WireError(exc.code, exc.message, param=f"session.{exc.param}", event_id=event_id)
    error_type = errors.INVALID_REQUEST_ERROR
    if opening:
        error_type = {
            errors.RESOURCE_EXHAUSTED: errors.RATE_LIMIT_ERROR,
            errors.SESSION_EXISTS: errors.INVALID_REQUEST_ERROR,
        }.get(exc.code, errors.SERVER_ERROR)
    return WireError(exc.code, exc.message, param=exc.param, event_id=event_id, error_type=error_type)


# ---------------------------------------------------------------------------
# WebSocket close codes (RFC 6455 §7.4.1)
# ---------------------------------------------------------------------------

_CLOSE_BY_CODE: dict[str, WSCloseCode] = {
    errors.RESOURCE_EXHAUSTED: WSCloseCode.TRY_AGAIN_LATER,
    errors.SHUTTING_DOWN: WSCloseCode.GOING_AWAY,
    errors.ENGINE_UNAVAILABLE: WSCloseCode.TRY_AGAIN_LATER,
    errors.MODEL_NOT_READY: WSCloseCode.TRY_AGAIN_LATER,
    errors.ENGINE_SLEEPING: WSCloseCode.TRY_AGAIN_LATER,
    errors.INVALID_PROMPT: WSCloseCode.POLICY_VIOLATION,
    # A connection whose URL named a session it cannot have (``?session_id=``, ``?resume=``).
    errors.SESSION_EXISTS: WSCloseCode.POLICY_VIOLATION,
    errors.UNKNOWN_SESSION: WSCloseCode.POLICY_VIOLATION,
    errors.SESSION_RESUME_CONFLICT: WSCloseCode.POLICY_VIOLATION,
}


def close_code(exc: RtserveError) -> WSCloseCode:
    """The close code for a socket ``exc`` ends: retry later, going away, bad data, or 1011."""
    if isinstance(exc, CodecError):
        return WSCloseCode.INVALID_TEXT  # 1007: the payload is not what the wire promised
    return _CLOSE_BY_CODE.get(exc.code, WSCloseCode.INTERNAL_ERROR)


# ---------------------------------------------------------------------------
# openpi and Moshi duplex error messages
# ---------------------------------------------------------------------------

OPENPI_INVALID_PAYLOAD = "Invalid request payload"
OPENPI_INFERENCE_ERROR = "Internal inference error"


def openpi_error_frame(exc: RtserveError) -> dict[str, Any]:
    """An openpi ``error`` frame. A malformed request keeps openpi's fixed message and
    carries the reason in ``detail``; a failed inference says nothing more."""
    if exc.code == errors.INVALID_PAYLOAD:
        return {"type": "error", "message": OPENPI_INVALID_PAYLOAD, "code": exc.code, "detail": exc.message}
    if exc.code == errors.INFERENCE_ERROR:
        return {"type": "error", "message": OPENPI_INFERENCE_ERROR, "code": exc.code}
    return {"type": "error", "message": exc.message, "code": exc.code}


def moshi_error_message(exc: RtserveError) -> dict[str, Any]:
    """A ``/v1/audio/duplex`` ``error`` message; the connection stays open."""
    return {"type": "error", "error": exc.message, "code": exc.code}
