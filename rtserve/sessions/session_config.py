"""The client-settable configuration of one session (``session.update``).

Server-owned limits live in ``rtserve.config.SessionLimits``; this model holds only what
a client may change, and ``check_bounds`` holds those values to the limits (issue 17: an
unbounded ``instructions`` or ``voice`` would fail every response later, or overflow the
session's output budget when echoed in ``session.updated``). Field names are transport-neutral:
projections render them in each dialect's shape (OpenAI GA ``audio.output.format``, beta ``output_audio_format``, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE
from rtserve.config import SessionLimits
from rtserve.engines.tools import InvalidTools, check_tools
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import ToolChoice, ToolSpec
from rtserve.errors import INVALID_VALUE, RtserveError

AudioFormat = Literal["pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw"]
Modality = Literal["audio", "text"]
PlaybackCommitPolicy = Literal["commit_all_on_done", "ack_only"]

G711_RATE = 8000
# What ``transcription.model`` reads when the client named none: the engine's own recognizer.
DEFAULT_TRANSCRIPTION_MODEL = "default"


class SessionConfig(BaseModel):
    """Effective configuration; immutable, so an event holding one is a snapshot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    instructions: str = ""
    voice: str | None = None
    modalities: tuple[Modality, ...] = ("audio", "text")
    input_audio_format: AudioFormat = "pcm16"
    output_audio_format: AudioFormat = "pcm16"
    output_sample_rate: int = Field(WIRE_SAMPLE_RATE, ge=8000, le=192000)
    turn_detection: TurnDetection | None = None
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    max_output_tokens: int | Literal["inf"] = "inf"
    playback_commit_policy: PlaybackCommitPolicy = "commit_all_on_done"
    tools: tuple[ToolSpec, ...] = ()  # functions responses may call (checked by check_tools)
    tool_choice: ToolChoice = ToolChoice()
    # Input transcription events (OpenAI ``audio.input.transcription``): the model name the
    # client gave, echoed; None = no ``input_audio_transcription`` events (turns are still
    # transcribed for the LLM). On by default, unlike OpenAI: this server always has the text.
    transcription_model: str | None = DEFAULT_TRANSCRIPTION_MODEL
    # ``runtime.control`` after every control signal (vLLM-Omni ``extra_body.emit_duplex_control_results``);
    # off: only after one the engine could honour only in part.
    emit_control_results: bool = False

    @model_validator(mode="after")
    def _check(self) -> SessionConfig:
        if not self.modalities:
            raise ValueError("modalities must not be empty")
        if self.output_audio_format.startswith("g711") and self.output_sample_rate != G711_RATE:
            # G.711 is 8 kHz by definition; the default 24 kHz is corrected rather than refused.
            object.__setattr__(self, "output_sample_rate", G711_RATE)
        if isinstance(self.max_output_tokens, int) and self.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be >= 1 or 'inf'")
        return self

    def updated(self, changes: dict[str, Any], limits: SessionLimits) -> SessionConfig:
        """A new config with ``changes`` applied, validated and within ``limits`` (raises
        ``ConfigUpdateError``)."""
        check_bounds(
            limits,
            instructions=changes.get("instructions"),
            voice=changes.get("voice"),
            max_output_tokens=changes.get("max_output_tokens"),
        )
        data = self.model_dump()
        data.update(changes)
        if "output_audio_format" in changes and "output_sample_rate" not in changes:
            # A format switch brings its own default rate (G.711 8 kHz, everything else 24 kHz).
            fmt = str(changes["output_audio_format"])
            data["output_sample_rate"] = G711_RATE if fmt.startswith("g711") else WIRE_SAMPLE_RATE
        try:
            config = SessionConfig.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigUpdateError(".".join(str(p) for p in err["loc"]) or "session", err["msg"]) from None
        if "tools" in changes or "tool_choice" in changes:
            try:  # a forced name must be among the tools the session has after this update
                check_tools(
                    config.tools,
                    config.tool_choice,
                    max_tools=limits.max_tools,
                    max_schema_bytes=limits.max_tool_schema_bytes,
                )
            except InvalidTools as exc:
                raise ConfigUpdateError(exc.param or "tools", exc.message) from None
        return config


def check_bounds(
    limits: SessionLimits, *, instructions: object = None, voice: object = None, max_output_tokens: object = None
) -> None:
    """Refuse a client-set value over its configured bound (``ConfigUpdateError`` naming it).
    Checked before any other validation, so an oversized value is never copied or echoed."""
    if isinstance(instructions, str) and len(instructions) > limits.max_instructions_chars:
        raise ConfigUpdateError(
            "instructions", f"instructions must be at most {limits.max_instructions_chars} characters"
        )
    if isinstance(voice, str) and len(voice) > limits.max_voice_chars:
        raise ConfigUpdateError("voice", f"voice must be at most {limits.max_voice_chars} characters")
    if isinstance(max_output_tokens, int) and max_output_tokens > limits.max_output_tokens:
        raise ConfigUpdateError(
            "max_output_tokens", f"max_output_tokens must be at most {limits.max_output_tokens} or 'inf'"
        )


class ConfigUpdateError(RtserveError, ValueError):
    code = INVALID_VALUE

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message, param=param)
        self.param: str = param
