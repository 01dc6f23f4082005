"""What an ``EngineSession`` emits (``events()``): speech boundaries, transcripts, agent
audio and text, tool-call pieces, the end of a response, a failure. Output is stamped with the
epoch it was made under, so the session core's fence can drop stale output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rtserve.engines.values import Pcm, ToolCallDelta


@dataclass(frozen=True)
class SpeechStarted:
    audio_ms: int  # offset in the session's input audio


@dataclass(frozen=True)
class SpeechStopped:
    audio_ms: int


@dataclass(frozen=True)
class InputTranscript:
    """A partial is text the turn's transcript grew by (clients append deltas, as OpenAI's do);
    the final is the turn's whole transcript, which may revise what the partials said."""

    text: str
    final: bool


def transcript_growth(sent: str, hypothesis: str) -> str:
    """What ``hypothesis`` adds to the text already ``sent``; "" when it revised any of it
    (sent deltas cannot be taken back: the final transcript settles it)."""
    return hypothesis[len(sent) :] if hypothesis.startswith(sent) else ""


@dataclass(frozen=True)
class OutputAudio:
    """Agent audio. ``response_id`` is None for continuous (lockstep) output."""

    pcm: Pcm
    epoch: int
    response_id: str | None = None
    text: str | None = None  # text spoken with this chunk (transcript piece), if any
    tick_due: float | None = None  # lockstep: when (time.monotonic) a tick of its engine was due
    input_samples: int | None = None  # lockstep: ``FrameOutput.input_samples`` of this frame


@dataclass(frozen=True)
class OutputText:
    text: str
    epoch: int
    response_id: str | None = None


@dataclass(frozen=True)
class OutputToolCall:
    """A piece of a function call the response makes (``ToolCallDelta``); text stays in ``OutputText``."""

    delta: ToolCallDelta
    epoch: int
    response_id: str | None = None


@dataclass(frozen=True)
class ResponseFinished:
    response_id: str
    epoch: int
    status: Literal["completed", "cancelled", "failed"]
    usage: dict[str, int] = field(default_factory=dict)
    reason: str | None = None


@dataclass(frozen=True)
class EngineFailure:
    code: str
    message: str


EngineEvent = (
    SpeechStarted
    | SpeechStopped
    | InputTranscript
    | OutputAudio
    | OutputText
    | ResponseFinished
    | EngineFailure
    | OutputToolCall
)
