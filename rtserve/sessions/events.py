"""Typed events a session emits, transport-neutral.

Every event carries ``session_id``, the session ``epoch`` current when it was emitted,
and a process-unique ``event_id``; delivery stamps ``server_event_seq`` when the event
is handed to a consumer. Payloads are immutable snapshots (frozen dataclasses, tuples,
an immutable ``SessionConfig``), so an event queued now renders the same bytes later.

``lane`` is the event's class in the bounded output buffer (docs/sessions.md#output-buffer): ordinary
events must fit the main budget, server-side errors and response endings may also use
the reserve, and one closure event has its own slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rtserve.codecs.pcm import FloatArray
from rtserve.errors import INVALID_REQUEST_ERROR
from rtserve.sessions.ids import new_event_id
from rtserve.sessions.session_config import AudioFormat, SessionConfig

ORDINARY = "ordinary"
RESERVE = "reserve"
CLOSURE = "closure"

ResponseStatus = Literal["completed", "cancelled", "failed", "incomplete"]
ResyncReason = Literal["journal_gap", "journal_overflow"]  # why a resume cannot replay


# ---------------------------------------------------------------------------
# Snapshots carried inside events
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    id: str
    config: SessionConfig
    capabilities: Mapping[str, Any]
    epoch: int
    turn_id: int
    resumable: bool


@dataclass(frozen=True, slots=True)
class ItemSnapshot:
    """One conversation item. ``kind`` is its content: audio (with transcript) or text."""

    id: str
    role: Literal["user", "assistant", "system"]
    kind: Literal["audio", "text", "function_call", "function_call_output"]
    text: str | None  # transcript or text (a function call's arguments, a call output); None while pending
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    call_id: str | None = None  # function items
    name: str | None = None  # function_call items


# ---------------------------------------------------------------------------
# Base classes
# ---------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, eq=False)
class SessionEvent:
    lane: ClassVar[str] = ORDINARY

    session_id: str
    epoch: int = 0
    event_id: str = field(default_factory=new_event_id)
    server_event_seq: int | None = None  # set by delivery, never by the runner


@dataclass(slots=True, kw_only=True, eq=False)
class ResponsePartEvent(SessionEvent):
    """An event about one content part of one response's output item."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


# ---------------------------------------------------------------------------
# Session lifecycle
# ---------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, eq=False)
class SessionCreated(SessionEvent):
    session: SessionSnapshot
    attachment_generation: int = 0
    resume_token: str | None = None


@dataclass(slots=True, kw_only=True, eq=False)
class SessionUpdated(SessionEvent):
    session: SessionSnapshot


@dataclass(slots=True, kw_only=True, eq=False)
class HeartbeatAck(SessionEvent):
    pass


@dataclass(slots=True, kw_only=True, eq=False)
class SessionClosed(SessionEvent):
    lane: ClassVar[str] = CLOSURE
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True, eq=False)
class SessionExpired(SessionEvent):
    lane: ClassVar[str] = CLOSURE
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)


TerminalEvent = SessionClosed | SessionExpired


@dataclass(slots=True, kw_only=True, eq=False)
class SessionResumed(SessionEvent):
    """First event on a resumed attachment; journaled events are replayed after it."""

    attachment_generation: int
    resume_token: str
    replayed: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class SessionReplaced(SessionEvent):
    """Last event on an attachment superseded by a resume elsewhere."""

    attachment_generation: int  # the generation that took over


@dataclass(slots=True, kw_only=True, eq=False)
class ResyncRequired(SessionEvent):
    """The events a resume asked for are gone: the client must start a new session."""

    reason: ResyncReason


@dataclass(slots=True, kw_only=True, eq=False)
class ErrorEvent(SessionEvent):
    code: str
    message: str
    error_type: str = INVALID_REQUEST_ERROR
    param: str | None = None
    related_event_id: str | None = None
    # Server-side errors may use the output reserve; refusals of a client's own commands
    # may not, so a client flooding bad commands cannot crowd out a response ending.
    uses_reserve: bool = True

    @property
    def lane(self) -> str:  # type: ignore[override]
        return RESERVE if self.uses_reserve else ORDINARY


# ---------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, eq=False)
class SpeechStarted(SessionEvent):
    audio_start_ms: int
    item_id: str


@dataclass(slots=True, kw_only=True, eq=False)
class SpeechStopped(SessionEvent):
    audio_end_ms: int
    item_id: str


@dataclass(slots=True, kw_only=True, eq=False)
class InputCommitted(SessionEvent):
    item_id: str
    previous_item_id: str | None
    turn_id: int


@dataclass(slots=True, kw_only=True, eq=False)
class InputCleared(SessionEvent):
    pass


@dataclass(slots=True, kw_only=True, eq=False)
class InputTimeoutTriggered(SessionEvent):
    """``server_vad`` ``idle_timeout_ms`` ran out: the buffered input is committed and answered."""

    audio_start_ms: int
    audio_end_ms: int
    item_id: str


@dataclass(slots=True, kw_only=True, eq=False)
class InputTranscriptDelta(SessionEvent):
    item_id: str
    delta: str
    content_index: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class InputTranscriptCompleted(SessionEvent):
    item_id: str
    transcript: str
    audio_seconds: float = 0.0  # duration of the committed input audio
    content_index: int = 0


# ---------------------------------------------------------------------------
# Conversation
# ---------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, eq=False)
class ItemAdded(SessionEvent):
    item: ItemSnapshot
    previous_item_id: str | None = None


@dataclass(slots=True, kw_only=True, eq=False)
class ItemDone(SessionEvent):
    item: ItemSnapshot
    previous_item_id: str | None = None


@dataclass(slots=True, kw_only=True, eq=False)
class ItemDeleted(SessionEvent):
    item_id: str


@dataclass(slots=True, kw_only=True, eq=False)
class ItemTruncated(SessionEvent):
    item_id: str
    audio_end_ms: int
    content_index: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class ItemRetrieved(SessionEvent):
    item: ItemSnapshot


# ---------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, eq=False)
class ResponseCreated(SessionEvent):
    response_id: str
    modalities: tuple[str, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True, eq=False)
class OutputItemAdded(SessionEvent):
    response_id: str
    item: ItemSnapshot
    output_index: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class OutputItemDone(SessionEvent):
    response_id: str
    item: ItemSnapshot
    output_index: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class ContentPartAdded(ResponsePartEvent):
    kind: Literal["audio", "text"]


@dataclass(slots=True, kw_only=True, eq=False)
class ContentPartDone(ResponsePartEvent):
    kind: Literal["audio", "text"]
    text: str


@dataclass(slots=True, kw_only=True, eq=False)
class AudioDelta(ResponsePartEvent):
    """Agent audio: mono float32 at ``sample_rate`` (the session's output rate)."""

    pcm: FloatArray
    sample_rate: int
    audio_format: AudioFormat = "pcm16"  # the wire format projections encode to

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.pcm) / self.sample_rate


@dataclass(slots=True, kw_only=True, eq=False)
class TranscriptDelta(ResponsePartEvent):
    """Text spoken with the audio (exactly one per ``AudioDelta``; may be empty)."""

    delta: str


@dataclass(slots=True, kw_only=True, eq=False)
class TextDelta(ResponsePartEvent):
    delta: str


@dataclass(slots=True, kw_only=True, eq=False)
class AudioDone(ResponsePartEvent):
    pass


@dataclass(slots=True, kw_only=True, eq=False)
class TranscriptDone(ResponsePartEvent):
    transcript: str


@dataclass(slots=True, kw_only=True, eq=False)
class TextDone(ResponsePartEvent):
    text: str


@dataclass(slots=True, kw_only=True, eq=False)
class FunctionCallArgumentsDelta(SessionEvent):
    response_id: str
    item_id: str
    call_id: str
    delta: str
    output_index: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class FunctionCallArgumentsDone(SessionEvent):
    response_id: str
    item_id: str
    call_id: str
    name: str
    arguments: str
    output_index: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class ResponseDone(SessionEvent):
    lane: ClassVar[str] = RESERVE
    response_id: str
    status: ResponseStatus
    status_details: Mapping[str, Any] | None = None
    output: tuple[ItemSnapshot, ...] = ()
    usage: Mapping[str, int] | None = None
    committed: bool = True  # whether the response entered conversation history
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True, eq=False)
class RateLimitsUpdated(SessionEvent):
    rate_limits: tuple[Mapping[str, Any], ...] = ()


# ---------------------------------------------------------------------------
# Duplex extensions
# ---------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True, eq=False)
class OverlapDecided(SessionEvent):
    """How speech overlapping agent output was handled (``overlap.decision``)."""

    action: Literal["barge_in", "listen", "drop"]
    reason: str
    policy: str
    overlap_ms: int | None = None


@dataclass(slots=True, kw_only=True, eq=False)
class ResponseListen(SessionEvent):
    """The model keeps listening: a commit ended with no response (``response.listen``)."""

    reason: str


@dataclass(slots=True, kw_only=True, eq=False)
class ResponseSpeak(SessionEvent):
    """The response speaks (``response.speak``, docs/sessions.md#duplex-extensions): sent once, before its first
    audio delta, for a response that says client-given ``text``."""

    response_id: str
    item_id: str
    text: str


@dataclass(slots=True, kw_only=True, eq=False)
class RuntimeControl(SessionEvent):
    """What a control signal did to the engine runtime (``runtime.control``, docs/sessions.md#duplex-extensions):
    ``result`` = ``{signal, ok, applied, unsupported}``. Sent when the engine could honour
    the signal only in part, and after every signal when the session asked for results."""

    result: dict[str, Any]


@dataclass(slots=True, kw_only=True, eq=False)
class OutputAudioCleared(SessionEvent):
    """Queued agent audio of ``response_id`` was discarded; the client stops its playback."""

    response_id: str


@dataclass(slots=True, kw_only=True, eq=False)
class PlaybackAcknowledged(SessionEvent):
    response_id: str
    item_id: str
    played_ms: int
    committed_ms: int
    history_committed: bool
