"""The client-settable configuration of one session (``session.update``).

Server-owned limits live in ``rtserve.config.SessionLimits``; this model holds only what
a client may change. Field names are transport-neutral: projections render them in each
dialect's shape (OpenAI GA ``audio.output.format``, beta ``output_audio_format``, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE
from rtserve.engines.protocols import TurnDetection
from rtserve.errors import INVALID_VALUE, RtserveError

AudioFormat = Literal["pcm16", "pcm_f32le", "g711_ulaw", "g711_alaw"]
Modality = Literal["audio", "text"]
PlaybackCommitPolicy = Literal["commit_all_on_done", "ack_only"]

G711_RATE = 8000


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

    def updated(self, changes: dict[str, Any]) -> SessionConfig:
        """A new config with ``changes`` applied and validated (raises ``ConfigUpdateError``)."""
        data = self.model_dump()
        data.update(changes)
        if "output_audio_format" in changes and "output_sample_rate" not in changes:
            # A format switch brings its own default rate (G.711 8 kHz, everything else 24 kHz).
            fmt = str(changes["output_audio_format"])
            data["output_sample_rate"] = G711_RATE if fmt.startswith("g711") else WIRE_SAMPLE_RATE
        try:
            return SessionConfig.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigUpdateError(".".join(str(p) for p in err["loc"]) or "session", err["msg"]) from None


class ConfigUpdateError(RtserveError, ValueError):
    code = INVALID_VALUE

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message, param=param)
        self.param: str = param
