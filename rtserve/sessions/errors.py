"""Stable error codes of the session core (duplex.md §6) and the exceptions that carry them.

Every refusal reaches clients as an ``ErrorEvent`` (or a ``SessionError`` for control
calls) with one of these codes; messages are short and never contain internal detail.
"""

from __future__ import annotations

# Session / control plane
UNKNOWN_SESSION = "unknown_session"
RESOURCE_EXHAUSTED = "resource_exhausted"
SESSION_RESUME_CONFLICT = "session_resume_conflict"
RESUME_UNSUPPORTED = "session_resume_unsupported"
SHUTTING_DOWN = "server_shutting_down"
# Input
INPUT_BACKPRESSURE = "input_backpressure"
INPUT_BUFFER_EMPTY = "input_audio_buffer_commit_empty"
# Output
OUTPUT_BACKPRESSURE = "output_backpressure"
# Commands
INVALID_VALUE = "invalid_value"
RESPONSE_ALREADY_ACTIVE = "conversation_already_has_active_response"
RESPONSE_NOT_ACTIVE = "response_cancel_not_active"
UNKNOWN_RESPONSE = "unknown_response"
ITEM_NOT_FOUND = "item_not_found"
BARGE_IN_UNSUPPORTED = "barge_in_unsupported"
TURN_CONTROL_UNSUPPORTED = "turn_control_unsupported"
PLAYBACK_ACK_OUT_OF_ORDER = "playback_ack_out_of_order"
ENGINE_ERROR = "engine_error"

# Error classes (``error.type``), as in OpenAI Realtime.
INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"


class SessionError(Exception):
    """A refused control call (open, resume, ...): ``code`` is one of the constants above."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class OutputOverflowError(Exception):
    """An event did not fit its class budget in a session's ``OutputBuffer``."""
