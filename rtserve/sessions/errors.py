"""The session core's exceptions. Its stable error codes (docs/sessions.md#session-errors) live in
``rtserve.errors`` with every other layer's and are re-exported here for the session code.

Every refusal reaches clients as an ``ErrorEvent`` (or a ``SessionError`` for control
calls) with one of these codes; messages are short and never contain internal detail.
"""

from __future__ import annotations

from rtserve.errors import (
    BARGE_IN_UNSUPPORTED,
    CONVERSATION_LIMIT_EXCEEDED,
    ENGINE_ERROR,
    INPUT_BACKPRESSURE,  # noqa: F401 (re-exported)
    INPUT_BUFFER_EMPTY,
    INVALID_REQUEST,
    INVALID_VALUE,
    ITEM_NOT_FOUND,
    OUTPUT_BACKPRESSURE,
    PLAYBACK_ACK_OUT_OF_ORDER,
    RATE_LIMIT,
    RESOURCE_EXHAUSTED,
    RESPONSE_ALREADY_ACTIVE,
    RESPONSE_NOT_ACTIVE,
    RESPONSE_SPEAK_UNSUPPORTED,
    SERVER_ERROR,
    SESSION_EXISTS,
    SESSION_RESUME_CONFLICT,
    SHUTTING_DOWN,
    TURN_CONTROL_UNSUPPORTED,
    UNKNOWN_RESPONSE,
    UNKNOWN_SESSION,
    RtserveError,
)


class SessionError(RtserveError):
    """A refused control call (open, resume, ...): ``code`` is one of the constants above."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


class OutputOverflowError(Exception):
    """An event did not fit its class budget in a session's ``OutputBuffer``."""
