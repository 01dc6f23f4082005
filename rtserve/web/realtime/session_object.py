"""The ``session`` object of ``session.update`` (and the native ``session.create``) ->
``SessionConfig`` changes: audio formats, turn detection, the GA, beta and native spellings.

Anything it cannot accept raises ``WireError``: a malformed field -> ``invalid_event``; an
unsupported value (audio format, rate, turn detection) -> ``invalid_value`` or
``unsupported_turn_detection``, naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE
from rtserve.sessions.session_config import G711_RATE, AudioFormat, TurnDetection
from rtserve.web.realtime.errors import (INVALID_VALUE, MAX_ECHOED_CHARS, UNSUPPORTED_TURN_DETECTION, WireError,
                                         field_path, invalid_event)
from rtserve.web.realtime.tools import tool_changes

_FORMAT_NAMES: dict[str, AudioFormat] = {
    "pcm16": "pcm16", "pcm_s16le": "pcm16", "s16le": "pcm16", "audio/pcm": "pcm16",
    "pcm_f32le": "pcm_f32le", "f32le": "pcm_f32le", "audio/pcm-f32le": "pcm_f32le",
    "g711_ulaw": "g711_ulaw", "audio/pcmu": "g711_ulaw",
    "g711_alaw": "g711_alaw", "audio/pcma": "g711_alaw",
}
_PCM_WIRE_RATE = WIRE_SAMPLE_RATE


class _FormatObject(BaseModel):
    """GA form: ``{"type": "audio/pcm", "rate": 24000}``, ``{"type": "audio/pcmu"}``, ..."""

    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    rate: StrictInt | None = None


FormatField = StrictStr | _FormatObject


def audio_format(value: FormatField, param: str) -> tuple[AudioFormat, int | None]:
    """A wire format (beta string or GA object) -> (``AudioFormat``, explicit rate or None)."""
    name = value if isinstance(value, str) else value.type
    fmt = _FORMAT_NAMES.get(name)
    if fmt is None:
        raise WireError(INVALID_VALUE, f"Unsupported audio format {name[:MAX_ECHOED_CHARS]!r}; use pcm16 "
                        "(audio/pcm), g711_ulaw (audio/pcmu), g711_alaw (audio/pcma) or pcm_f32le", param=param)
    rate = None if isinstance(value, str) else value.rate
    if rate is not None and fmt.startswith("g711") and rate != G711_RATE:
        raise WireError(INVALID_VALUE, f"G.711 audio is {G711_RATE} Hz", param=f"{param}.rate")
    return fmt, rate


def _input_format(value: FormatField, param: str) -> AudioFormat:
    fmt, rate = audio_format(value, param)
    if rate is not None and not fmt.startswith("g711") and rate != _PCM_WIRE_RATE:
        raise WireError(INVALID_VALUE, f"Input PCM is {_PCM_WIRE_RATE} Hz; other rates go in each append's "
                        "sample_rate_hz", param=f"{param}.rate")
    return fmt


class _AudioInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: FormatField | None = None
    turn_detection: dict[str, Any] | None = None


class _AudioOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: FormatField | None = None
    voice: StrictStr | None = None


class _Audio(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: _AudioInput | None = None
    output: _AudioOutput | None = None


MaxTokens = Annotated[StrictInt, Field(ge=1)] | Literal["inf"]


class SessionObject(BaseModel):
    """The ``session`` of ``session.update`` in any spelling: GA (``audio.input.format``,
    ``output_modalities``), beta (``input_audio_format``, ``modalities``,
    ``max_response_output_tokens``) or native (the ``SessionConfig`` field names).
    Fields this server has no use for (tracing, noise reduction, ...) are ignored; ``tools``
    and ``tool_choice`` are read by ``rtserve.web.realtime.tools``."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["realtime"] | None = None
    model: StrictStr | None = None
    instructions: StrictStr | None = None
    voice: StrictStr | None = None
    modalities: list[Literal["audio", "text"]] | None = None
    output_modalities: list[Literal["audio", "text"]] | None = None
    input_audio_format: FormatField | None = None
    output_audio_format: FormatField | None = None
    output_sample_rate: StrictInt | None = None
    audio: _Audio | None = None
    turn_detection: dict[str, Any] | None = None
    temperature: float | None = None
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None
    playback_commit_policy: Literal["commit_all_on_done", "ack_only"] | None = None


def turn_detection(value: dict[str, Any] | None, param: str, *, supports_server_vad: bool) -> dict[str, Any] | None:
    """An OpenAI ``turn_detection`` object -> ``TurnDetection`` fields (None = manual commit)."""
    if value is None:
        return None
    kind = value.get("type", "server_vad")
    if kind != "server_vad":
        raise WireError(UNSUPPORTED_TURN_DETECTION, f"Turn detection {str(kind)[:MAX_ECHOED_CHARS]!r} is not "
                        "supported; use server_vad or null", param=f"{param}.type")
    if not supports_server_vad:
        raise WireError(UNSUPPORTED_TURN_DETECTION, "This engine has no server VAD; set turn_detection to null and "
                        "commit input yourself", param=param)
    known = {k: v for k, v in value.items() if k in TurnDetection.model_fields}
    try:
        return TurnDetection.model_validate(known).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = field_path(err["loc"])
        raise WireError(INVALID_VALUE, f"{where}: {err['msg']}", param=f"{param}.{where}") from None


def session_changes(raw: Any, *, supports_server_vad: bool) -> dict[str, Any]:
    """Validate a ``session`` object -> ``SessionConfig`` changes (only what it names)."""
    if not isinstance(raw, dict):
        raise invalid_event("'session' must be an object", param="session")
    try:
        body = SessionObject.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = field_path(err["loc"])
        if where == "type":
            raise WireError(INVALID_VALUE, "Only 'realtime' sessions are served", param="session.type") from None
        raise invalid_event(f"session.{where}: {err['msg']}", param=f"session.{where}") from None
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    for name in ("model", "instructions", "voice", "temperature", "output_sample_rate", "playback_commit_policy"):
        if getattr(body, name) is not None:
            changes[name] = getattr(body, name)
    modalities = body.output_modalities or body.modalities
    if modalities is not None:
        changes["modalities"] = tuple(dict.fromkeys(modalities))
    tokens = body.max_output_tokens or body.max_response_output_tokens
    if tokens is not None:
        changes["max_output_tokens"] = tokens
    if body.input_audio_format is not None:
        changes["input_audio_format"] = _input_format(body.input_audio_format, "session.input_audio_format")
    if body.output_audio_format is not None:
        changes.update(_output_format(body.output_audio_format, "session.output_audio_format"))
    if "turn_detection" in given:
        changes["turn_detection"] = turn_detection(body.turn_detection, "session.turn_detection",
                                                   supports_server_vad=supports_server_vad)
    audio = body.audio
    if audio is not None and audio.input is not None:
        if audio.input.format is not None:
            changes["input_audio_format"] = _input_format(audio.input.format, "session.audio.input.format")
        if "turn_detection" in audio.input.model_fields_set:
            changes["turn_detection"] = turn_detection(audio.input.turn_detection, "session.audio.input.turn_detection",
                                                       supports_server_vad=supports_server_vad)
    if audio is not None and audio.output is not None:
        if audio.output.format is not None:
            changes.update(_output_format(audio.output.format, "session.audio.output.format"))
        if audio.output.voice is not None:
            changes["voice"] = audio.output.voice
    changes.update(tool_changes(raw))
    return changes


def _output_format(value: FormatField, param: str) -> dict[str, Any]:
    fmt, rate = audio_format(value, param)
    return {"output_audio_format": fmt} if rate is None else {"output_audio_format": fmt, "output_sample_rate": rate}
