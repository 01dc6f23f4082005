"""One error base for every layer, and the one catalogue of stable error codes.

Every error a client can see (docs/serving.md#errors, docs/sessions.md#session-errors) is an ``RtserveError``: a
short human ``message`` with no internal detail, a stable machine-readable ``code`` and,
where one field is at fault, the ``param`` naming it. Layers subclass it (``CodecError``,
``EngineError``, ``SessionError``, the transports' wire errors) and set a class-level
default ``code``; how each wire renders one lives in ``rtserve.web.error_mapping``.

The constants below are every code and every ``error.type`` a client can receive; the rest
of the package names them, never spells them out (``tests/test_error_catalogue.py`` checks
that, and that README.md's error table lists exactly these codes).

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
SESSION_EXPIRED = "session_expired"  # sessions.max_session_duration_s
SESSION_IDLE_TIMEOUT = "session_idle_timeout"  # sessions.inactivity_timeout_s
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
INVALID_MESSAGE = "invalid_message"  # a /v1/audio/duplex message of the wrong shape
INVALID_MSGPACK = "invalid_msgpack"  # an /api/asr-streaming or /api/tts_streaming message that is not msgpack
TOO_MANY_MARKERS = "too_many_markers"  # asr_streaming.max_pending_markers
UNKNOWN_MESSAGE_TYPE = "unknown_type"  # a /v1/audio/duplex message of an unknown type
UNSUPPORTED_TURN_DETECTION = "unsupported_turn_detection"
INVALID_TURN_DETECTION = "invalid_turn_detection"  # the engine refused the turn detection asked for
RESPONSE_ALREADY_ACTIVE = "conversation_already_has_active_response"
RESPONSE_NOT_ACTIVE = "response_cancel_not_active"
UNKNOWN_RESPONSE = "unknown_response"
ITEM_NOT_FOUND = "item_not_found"
CONVERSATION_LIMIT_EXCEEDED = "conversation_limit_exceeded"
BARGE_IN_UNSUPPORTED = "barge_in_unsupported"
TURN_CONTROL_UNSUPPORTED = "turn_control_unsupported"
RESPONSE_SPEAK_UNSUPPORTED = "response_speak_unsupported"  # the engine cannot be made to say given text
NATIVE_DUPLEX_UNAVAILABLE = "native_duplex_unavailable"  # ?native_duplex= asks for what the engine is not
DUPLEX_API_UNAVAILABLE = "duplex_unavailable"  # a duplex route on a server that does not serve one
PLAYBACK_ACK_OUT_OF_ORDER = "playback_ack_out_of_order"
# HTTP requests
INVALID_API_KEY = "invalid_api_key"
MALFORMED_REQUEST = "invalid_request"  # the request as a whole, not one field (multipart parts, vLLM's 400)
MISSING_PARAMETER = "missing_required_parameter"
INVALID_CONTENT_TYPE = "invalid_content_type"
INVALID_MULTIPART = "invalid_multipart"
REQUEST_TOO_LARGE = "request_too_large"
REQUEST_TIMEOUT = "request_timeout"
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # transport.max_concurrent_http_generations
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
MODEL_NOT_FOUND = "model_not_found"
TASK_UNAVAILABLE = "task_unavailable"  # the model exists but this server does not serve that task with it
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
SLEEP_MODE_DISABLED = "sleep_mode_disabled"  # /v1/omni/sleep without --enable-sleep-mode
PEER_UNAUTHORIZED = "peer_unauthorized"  # a peer route called by something not a front-end of this cluster
# Audio input (codecs)
INVALID_AUDIO = "invalid_audio"
INVALID_BASE64 = "invalid_base64"
INVALID_OGG = "invalid_ogg"
INVALID_OPUS = "invalid_opus"
INVALID_WAV = "invalid_wav"
UNSUPPORTED_FORMAT = "unsupported_format"
AUDIO_LIMIT_EXCEEDED = "audio_limit_exceeded"
AUDIO_TOO_LONG = "audio_too_long"  # an HTTP upload over the decoded-audio limit (413)
EMPTY_AUDIO = "empty_audio"
DECODE_RATE_EXCEEDED = "decode_rate_exceeded"  # codecs.max_decoded_audio_ratio
# Engines
ENGINE_ERROR = "engine_error"
ENGINE_UNAVAILABLE = "engine_unavailable"
ENGINE_FAILED = "engine_failed"  # the server's models failed to load at startup (/health says failed)
ENGINE_PROCESS_LOST = "engine_failure"  # the engine process stopped under a live session
MODEL_NOT_READY = "model_not_ready"
MODEL_UNAVAILABLE = "model_unavailable"
MODEL_LOAD_FAILED = "model_load_failed"
ENGINE_SLEEPING = "engine_sleeping"  # sleep mode unloaded the models (POST /v1/omni/wakeup)
SLEEP_UNSUPPORTED = "sleep_unsupported"  # an engine stage that cannot be put to sleep
STAGE_BUSY = "stage_busy"  # a sleep request while a stage's in-flight work outlasts cascade.sleep_drain_timeout_s
CANCELLED = "cancelled"  # an engine stream cancelled by the engine side (shutdown)
GENERATION_FAILED = "generation_failed"
SYNTHESIS_FAILED = "synthesis_failed"
UNSUPPORTED_LANGUAGE = "unsupported_language"
INVALID_VOICE = "invalid_voice"
SESSION_BUSY = "session_busy"  # a streaming-speech session.config while text waits to be spoken
TOKENIZE_UNSUPPORTED = "tokenize_unsupported"  # POST /tokenize on an LLM that does not count tokens
TTS_STREAMING_UNAVAILABLE = "tts_streaming_unavailable"  # /api/tts_streaming on a server with no TTS at all
ASR_STREAMING_UNAVAILABLE = "asr_streaming_unavailable"  # /api/asr-streaming on a server with no ASR at all
STREAM_ALREADY_ENDED = "stream_already_ended"  # /api/tts_streaming: text or Eos after the Eos
IMAGES_UNAVAILABLE = "images_unavailable"  # /v1/images/* on a server with no image engine (image_engine.weights)
# Voices (POST/DELETE /v1/audio/voices)
VOICE_EXISTS = "voice_exists"
VOICE_NOT_FOUND = "voice_not_found"
VOICE_NOT_DELETABLE = "voice_not_deletable"
VOICE_LIMIT_EXCEEDED = "voice_limit_exceeded"
INVALID_VOICE_MODEL = "invalid_voice_model"
VOICE_REGISTRATION_UNSUPPORTED = "voice_registration_unsupported"
VOICE_MODEL_REJECTED = "voice_model_rejected"  # an uploaded model past a voices.sandbox_* limit
SPEECH_TOO_LONG = "speech_too_long"  # voices.max_speech_s_per_char, http.max_speech_batch_s
# Robot policies (openpi route)
INVALID_OBSERVATION = "invalid_observation"
POLICY_OVERLOADED = "overloaded"  # robot.max_pending_requests
INFERENCE_ERROR = "inference_error"
POLICY_UNAVAILABLE = "unavailable"  # the policy is stopping, or the engine process has none
NO_POLICY = "unsupported"  # this server serves no robot policy (openpi clients read "unsupported")
# WebRTC calls (/v1/realtime/calls)
INVALID_SDP = "invalid_sdp"
UNKNOWN_CALL = "unknown_call"
# Images and camera frames (docs/video.md#errors)
VISION_UNSUPPORTED = "vision_unsupported"  # images or video for an LLM that cannot see
INVALID_IMAGE = "invalid_image"  # not a JPEG or PNG, or not decodable
IMAGE_TOO_LARGE = "image_too_large"  # video_input.max_image_bytes / max_image_pixels
FRAME_RATE_EXCEEDED = "frame_rate_exceeded"  # video_input.max_frames_per_s on WS /v1/video/chat/stream
# Generated video (/v1/videos, WS /v1/realtime/video)
VIDEO_NOT_FOUND = "video_not_found"  # no such job, or it was deleted or expired
VIDEO_NOT_READY = "video_not_ready"  # content of a job that is not completed
JOB_INTERRUPTED = "job_interrupted"  # a job the server's restart cut short
START_TIMEOUT = "start_timeout"  # WS /v1/realtime/video: no session.start within videos.start_timeout_s
GENERATION_STALLED = "generation_stalled"  # WS /v1/realtime/video: no progress nor ping within videos.stall_timeout_s
INTERACTION_UNSUPPORTED = "interaction_unsupported"  # session.interaction on a model without prompt updates
GENERATION_TIMEOUT = "generation_timeout"  # POST /v1/videos/sync past videos.sync_timeout_s
# Anything unexpected
INTERNAL_ERROR = "internal_error"

# Error classes (``error.type``), as in OpenAI Realtime and the OpenAI HTTP API.
INVALID_REQUEST_ERROR = "invalid_request_error"
AUTHENTICATION_ERROR = "authentication_error"
NOT_FOUND_ERROR = "not_found_error"
RATE_LIMIT_ERROR = "rate_limit_error"
SERVER_ERROR = "server_error"
ERROR_TYPES = frozenset({INVALID_REQUEST_ERROR, AUTHENTICATION_ERROR, NOT_FOUND_ERROR, RATE_LIMIT_ERROR, SERVER_ERROR})


class RtserveError(Exception):
    """A failure with a client-safe ``message``, a stable ``code`` and an optional ``param``."""

    code: str = INTERNAL_ERROR

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
