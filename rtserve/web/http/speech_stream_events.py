"""The events of ``WS /v1/audio/speech/stream`` (``speech_stream.py``): the client's, parsed
into typed values, and the items the connection queues for its speaker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from rtserve.errors import INVALID_EVENT, RtserveError
from rtserve.web.http.audio import SPEECH_SAMPLE_RATE, SpeechFormat
from rtserve.web.http.common import validation_error
from rtserve.web.http.speech import VoiceRef


class StreamConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    voice: str | VoiceRef | None = None
    response_format: SpeechFormat = "pcm"
    speed: float = Field(1.0, ge=0.25, le=4.0)

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice

    def public(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "voice": self.voice_name,
            "response_format": self.response_format,
            "speed": self.speed,
            "sample_rate": SPEECH_SAMPLE_RATE,
        }


class TextEvent(BaseModel):
    text: StrictStr


@dataclass(frozen=True)
class Sentence:
    utterance: int
    index: int
    text: str


@dataclass(frozen=True)
class UtteranceEnd:
    utterance: int
    sentences: int


class Close:
    """Queued by ``session.close``: the speaker stops after what came before it."""


Item = Sentence | UtteranceEnd | Close


class StreamError(RtserveError):
    """An error event for this connection (it stays open)."""


def parse_event(model: type[Any], event: dict[str, Any]) -> Any:
    try:
        return model.model_validate({k: v for k, v in event.items() if k != "type"})
    except ValidationError as exc:
        error = validation_error(exc)
        raise StreamError(error.message, code=error.code or INVALID_EVENT, param=error.param) from None
