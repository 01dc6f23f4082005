"""The ``session`` object of ``session.update`` (and the native ``session.create``) ->
``SessionConfig`` changes: audio formats, turn detection, the GA, beta and native spellings.

Anything it cannot accept raises ``WireError``: a malformed field -> ``invalid_event``; an
unsupported value (audio format, rate, turn detection) -> ``invalid_value`` or
``unsupported_turn_detection``, naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE
from rtserve.engines.turn_detection import TurnDetection
from rtserve.errors import INVALID_VALUE, UNSUPPORTED_TURN_DETECTION
from rtserve.sessions.session_config import DEFAULT_TRANSCRIPTION_MODEL, G711_RATE, AudioFormat
from rtserve.web.realtime.errors import MAX_ECHOED_CHARS, WireError, field_path, invalid_event
from rtserve.web.realtime.tools import tool_changes

_FORMAT_NAMES: dict[str, AudioFormat] = {
    "pcm16": "pcm16",
    "pcm_s16le": "pcm16",
    "s16le": "pcm16",
    "audio/pcm": "pcm16",
    "pcm_f32le": "pcm_f32le",
    "f32le": "pcm_f32le",
    "audio/pcm-f32le": "pcm_f32le",
    "g711_ulaw": "g711_ulaw",
    "audio/pcmu": "g711_ulaw",
    "g711_alaw": "g711_alaw",
    "audio/pcma": "g711_alaw",
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
        raise WireError(
            INVALID_VALUE,
            f"Unsupported audio format {name[:MAX_ECHOED_CHARS]!r}; use pcm16 "
            "(audio/pcm), g711_ulaw (audio/pcmu), g711_alaw (audio/pcma) or pcm_f32le",
            param=param,
        )
    rate = None if isinstance(value, str) else value.rate
    if rate is not None and fmt.startswith("g711") and rate != G711_RATE:
        raise WireError(INVALID_VALUE, f"G.711 audio is {G711_RATE} Hz", param=f"{param}.rate")
    return fmt, rate


def _input_format(value: FormatField, param: str) -> AudioFormat:
    fmt, rate = audio_format(value, param)
    if rate is not None and not fmt.startswith("g711") and rate != _PCM_WIRE_RATE:
        raise WireError(
            INVALID_VALUE,
            f"Input PCM is {_PCM_WIRE_RATE} Hz; other rates go in each append's sample_rate_hz",
            param=f"{param}.rate",
        )
    return fmt


class _AudioInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: FormatField | None = None
    turn_detection: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None
    transcription: dict[str, Any] | None = None


class _AudioOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: FormatField | None = None
    voice: StrictStr | None = None
    speed: float | None = None


class _Audio(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: _AudioInput | None = None
    output: _AudioOutput | None = None


MaxTokens = Annotated[StrictInt, Field(ge=1)] | Literal["inf"]


class _ExtraBody(BaseModel):
    """vLLM-Omni's model-specific ``extra_body``: what this server honours; the rest is ignored."""

    model_config = ConfigDict(extra="ignore")
    emit_duplex_control_results: StrictBool | None = None  # ``runtime.control`` after every control signal


class SessionObject(BaseModel):
    """The ``session`` of ``session.update`` in any spelling: GA (``audio.input.format``,
    ``output_modalities``), beta (``input_audio_format``, ``modalities``,
    ``max_response_output_tokens``) or native (the ``SessionConfig`` field names).
    Fields this server has no use for (tracing, ...) are ignored; audio options it cannot
    honour (noise reduction, a speed other than 1.0) are refused (``_audio_options``); ``tools``
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
    input_audio_noise_reduction: dict[str, Any] | None = None  # beta spellings of the audio.* fields
    input_audio_transcription: dict[str, Any] | None = None
    speed: float | None = None
    extra_body: _ExtraBody | None = None


_SERVER_VAD_FIELDS = frozenset(TurnDetection.model_fields) - {"eagerness"}
_SEMANTIC_FIELDS = frozenset({"type", "eagerness", "create_response", "interrupt_response"})


def turn_detection(value: dict[str, Any] | None, param: str, *, supports_server_vad: bool) -> dict[str, Any] | None:
    """An OpenAI ``turn_detection`` object -> ``TurnDetection`` fields (None = manual commit)."""
    if value is None:
        return None
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise WireError(
            UNSUPPORTED_TURN_DETECTION,
            f"Turn detection {str(kind)[:MAX_ECHOED_CHARS]!r} is not supported; use server_vad, semantic_vad or null",
            param=f"{param}.type",
        )
    if not supports_server_vad:
        raise WireError(
            UNSUPPORTED_TURN_DETECTION,
            "This engine has no server VAD; set turn_detection to null and commit input yourself",
            param=param,
        )
    # Each type takes OpenAI's own fields for it (semantic_vad: eagerness, no idle timeout).
    fields = _SEMANTIC_FIELDS if kind == "semantic_vad" else _SERVER_VAD_FIELDS
    if kind == "semantic_vad" and value.get("idle_timeout_ms") is not None:
        raise WireError(
            INVALID_VALUE,
            "idle_timeout_ms is only supported with server_vad, as on OpenAI",
            param=f"{param}.idle_timeout_ms",
        )
    known = {k: v for k, v in value.items() if k in fields}
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
        changes["turn_detection"] = turn_detection(
            body.turn_detection, "session.turn_detection", supports_server_vad=supports_server_vad
        )
    audio = body.audio
    changes.update(_audio_options(body))
    if audio is not None and audio.input is not None:
        if audio.input.format is not None:
            changes["input_audio_format"] = _input_format(audio.input.format, "session.audio.input.format")
        if "turn_detection" in audio.input.model_fields_set:
            changes["turn_detection"] = turn_detection(
                audio.input.turn_detection,
                "session.audio.input.turn_detection",
                supports_server_vad=supports_server_vad,
            )
    if audio is not None and audio.output is not None:
        if audio.output.format is not None:
            changes.update(_output_format(audio.output.format, "session.audio.output.format"))
        if audio.output.voice is not None:
            changes["voice"] = audio.output.voice
    changes.update(tool_changes(raw))
    if body.extra_body is not None and body.extra_body.emit_duplex_control_results is not None:
        changes["emit_control_results"] = body.extra_body.emit_duplex_control_results
    return changes


def _output_format(value: FormatField, param: str) -> dict[str, Any]:
    fmt, rate = audio_format(value, param)
    return {"output_audio_format": fmt} if rate is None else {"output_audio_format": fmt, "output_sample_rate": rate}


def _audio_options(body: SessionObject) -> dict[str, Any]:
    """Noise reduction, output speed and input transcription, in either spelling: what the
    server honours becomes a change; what it cannot do is refused, never ignored.

    * ``noise_reduction``: none here (the VAD and Whisper take the raw input) -> only null;
    * ``speed``: replies are spoken at the voice's own rate -> only 1.0;
    * ``transcription``: the engine's own recognizer transcribes every committed turn (the
      LLM needs the text); an object (any ``model``; ``language`` English, no ``prompt``:
      Whisper tiny.en) turns the ``input_audio_transcription`` events on, null turns them off.
    """
    changes: dict[str, Any] = {}
    audio_in = body.audio.input if body.audio is not None else None
    audio_out = body.audio.output if body.audio is not None else None
    noise = [(body.input_audio_noise_reduction, "session.input_audio_noise_reduction")]
    if audio_in is not None:
        noise.append((audio_in.noise_reduction, "session.audio.input.noise_reduction"))
    for value, param in noise:
        if value is not None:
            raise WireError(
                INVALID_VALUE, "Input noise reduction is not supported by this server; set it to null", param=param
            )
    speeds = [(body.speed, "session.speed")]
    if audio_out is not None:
        speeds.append((audio_out.speed, "session.audio.output.speed"))
    for speed, param in speeds:
        if speed is not None and speed != 1.0:
            raise WireError(INVALID_VALUE, "Only speed 1.0 is supported by this server", param=param)
    given: list[tuple[dict[str, Any] | None, str]] = []
    if "input_audio_transcription" in body.model_fields_set:
        given.append((body.input_audio_transcription, "session.input_audio_transcription"))
    if audio_in is not None and "transcription" in audio_in.model_fields_set:
        given.append((audio_in.transcription, "session.audio.input.transcription"))
    for value, param in given:
        changes["transcription_model"] = _transcription_model(value, param)
    return changes


def _transcription_model(value: dict[str, Any] | None, param: str) -> str | None:
    if value is None:
        return None
    model, language, prompt = value.get("model"), value.get("language"), value.get("prompt")
    if model is not None and not isinstance(model, str):
        raise invalid_event(f"{param}.model must be a string", param=f"{param}.model")
    if language is not None and (not isinstance(language, str) or not language.lower().startswith("en")):
        raise WireError(
            INVALID_VALUE,
            "The input recognizer is English-only; set language to 'en' or leave it out",
            param=f"{param}.language",
        )
    if prompt:
        raise WireError(
            INVALID_VALUE, "Transcription prompts are not supported by this server", param=f"{param}.prompt"
        )
    return (model or DEFAULT_TRANSCRIPTION_MODEL)[:MAX_ECHOED_CHARS]
