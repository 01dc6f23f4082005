"""One error base for every layer, and the one catalogue of stable error codes.

Every error a client can see (docs/serving.md#errors, docs/sessions.md#session-errors) is an ``RtserveError``: a
short human ``message`` with no internal detail, a stable machine-readable ``code`` and,
where one field is at fault, the ``param`` naming it. Layers subclass it (``CodecError``,
``EngineError``, ``SessionError``, the transports' wire errors) and set a class-level
default ``code``; how each wire renders one lives in ``rtserve.web.error_mapping``.

This module imports nothing from rtserve, so codecs/ and engines/ can use it too.
"""

from __future__ import annotations

# Session / control plane
UNKNOWN_SESSION = "unknown_session"
RESOURCE_EXHAUSTED = "resource_exhausted"
SESSION_RESUME_CONFLICT = "session_resume_conflict"
SHUTTING_DOWN = "server_shutting_down"
SESSION_NOT_OPEN = "session_not_open"
SESSION_ALREADY_OPEN = "session_already_open"
SESSION_EXISTS = "session_exists"  # ?session_id= names a session that is still held (docs/sessions.md#connection-url)
# Input
INPUT_BACKPRESSURE = "input_backpressure"
INPUT_BUFFER_EMPTY = "input_audio_buffer_commit_empty"
# Output
OUTPUT_BACKPRESSURE = "output_backpressure"
# Client events and commands
INVALID_EVENT = "invalid_event"
INVALID_VALUE = "invalid_value"
INVALID_JSON = "invalid_json"
INVALID_PAYLOAD = "invalid_payload"
INVALID_PROMPT = "invalid_prompt"
UNSUPPORTED_TURN_DETECTION = "unsupported_turn_detection"
RESPONSE_ALREADY_ACTIVE = "conversation_already_has_active_response"
RESPONSE_NOT_ACTIVE = "response_cancel_not_active"
UNKNOWN_RESPONSE = "unknown_response"
ITEM_NOT_FOUND = "item_not_found"
CONVERSATION_LIMIT_EXCEEDED = "conversation_limit_exceeded"
BARGE_IN_UNSUPPORTED = "barge_in_unsupported"
TURN_CONTROL_UNSUPPORTED = "turn_control_unsupported"
RESPONSE_SPEAK_UNSUPPORTED = "response_speak_unsupported"  # the engine cannot be made to say given text
NATIVE_DUPLEX_UNAVAILABLE = "native_duplex_unavailable"  # ?native_duplex= asks for what the engine is not
PLAYBACK_ACK_OUT_OF_ORDER = "playback_ack_out_of_order"
# Audio input (codecs)
INVALID_AUDIO = "invalid_audio"
INVALID_BASE64 = "invalid_base64"
# Engines
ENGINE_ERROR = "engine_error"
ENGINE_UNAVAILABLE = "engine_unavailable"
MODEL_NOT_READY = "model_not_ready"
MODEL_UNAVAILABLE = "model_unavailable"
ENGINE_SLEEPING = "engine_sleeping"  # sleep mode unloaded the models (POST /v1/omni/wakeup)
NOT_IMPLEMENTED = "not_implemented"  # e.g. wake after sleep(level=2)
# Voices (POST/DELETE /v1/audio/voices)
VOICE_EXISTS = "voice_exists"
VOICE_NOT_FOUND = "voice_not_found"
VOICE_NOT_DELETABLE = "voice_not_deletable"
VOICE_LIMIT_EXCEEDED = "voice_limit_exceeded"
INVALID_VOICE_MODEL = "invalid_voice_model"
VOICE_REGISTRATION_UNSUPPORTED = "voice_registration_unsupported"
# WebRTC calls (/v1/realtime/calls)
INVALID_SDP = "invalid_sdp"
UNKNOWN_CALL = "unknown_call"
# Anything unexpected
INTERNAL_ERROR = "internal_error"

# Error classes (``error.type``), as in OpenAI Realtime and the OpenAI HTTP API.
INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"


class RtserveError(Exception):
    """A failure with a client-safe ``message``, a stable ``code`` and an optional ``param``."""

    code: str = INTERNAL_ERROR

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
