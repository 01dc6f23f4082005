"""Typed commands a client submits to a session (transport-neutral).

Transports parse their wire events into these; ``event_id`` is the client's own event id,
echoed back as ``related_event_id`` on any error the command causes.
Audio is mono float32 at the engine's ``capabilities.input_sample_rate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.values import ToolChoice, ToolSpec


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Command:
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class AppendAudio(Command):
    audio: FloatArray
    video_frames: tuple[str, ...] = ()  # bare base64 images riding on the append
    is_speech: bool | None = None  # client speech hint

    @property
    def input_bytes(self) -> int:
        """What input backpressure reserves: audio bytes plus base64 video-frame bytes
        (docs/sessions.md#input-backpressure)."""
        return int(self.audio.nbytes) + sum(len(frame) for frame in self.video_frames)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Commit(Command):
    """End of the user's turn (``input_audio_buffer.commit``)."""

    response_create: bool = False  # also start a response once the turn is transcribed
    is_speech: bool | None = None  # False: the client declares silence (duplex): no turn, ``response.listen``


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Clear(Command):
    """``input``: drop uncommitted input audio. ``output``: stop agent audio (advances the epoch)."""

    target: Literal["input", "output"] = "input"


@dataclass(frozen=True, slots=True)
class ResponseInput:
    """One item of an out-of-band response's own ``input``: a message, or a reference to a
    conversation item (``item_id``; its text is looked up when the response starts)."""

    role: Literal["user", "assistant", "system"] = "user"
    text: str = ""
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ResponseCreate(Command):
    """Per-response overrides; ``None`` keeps the session value."""

    instructions: str | None = None
    modalities: tuple[Literal["audio", "text"], ...] | None = None
    voice: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    metadata: Mapping[str, Any] | None = None
    tools: tuple[ToolSpec, ...] | None = None
    tool_choice: ToolChoice | None = None
    # Out-of-band (OpenAI): "none" keeps the output out of the conversation; ``input`` replaces
    # the conversation as the response's context (None: the conversation is the context).
    conversation: Literal["auto", "none"] = "auto"
    input: tuple[ResponseInput, ...] | None = None
    # ``response.speak`` (duplex): the response says exactly this text (no generation); only
    # engines whose capabilities say ``supports_speak`` can.
    speak: str | None = None

    @property
    def out_of_band(self) -> bool:
        return self.conversation == "none"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ResponseCancel(Command):
    response_id: str | None = None  # None: the active response


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Heartbeat(Command):
    pass


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PlaybackAck(Command):
    """Client playback progress of one response (``playback.ack``, docs/sessions.md#playback-acknowledgement)."""

    response_id: str
    played_ms: int
    committed_ms: int | None = None  # defaults to ``played_ms``
    truncate: bool = False  # the client stopped here: record exactly what was heard


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class OverlapDecision(Command):
    """The client's own verdict on speech that overlapped agent output:
    ``barge_in`` interrupts, ``listen`` keeps the input for the next turn, ``drop`` discards it."""

    action: Literal["barge_in", "listen", "drop"]
    overlap_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class BargeIn(Command):
    source: str = "client_event"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SessionUpdate(Command):
    """Partial ``SessionConfig`` changes, validated by the runner (typed error when invalid)."""

    changes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ConversationItemCreate(Command):
    role: Literal["user", "assistant", "system"]
    text: str
    previous_item_id: str | None = None  # None: append at the end
    item_id: str | None = None  # None: server-allocated
    audio: bool = False  # the client sent audio: ``text`` is its transcript
    images: tuple[str, ...] = ()  # ``input_image`` parts: JPEG data URLs, already bounded (docs/video.md)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class VideoFrame(Command):
    """One sampled camera frame (a JPEG data URL, already downscaled): held for the next user turn."""

    image: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class FunctionItemCreate(Command):
    """A ``function_call`` item (the client restores a call) or a ``function_call_output``
    item (the result of a call the assistant made) added to the conversation."""

    kind: Literal["function_call", "function_call_output"]
    call_id: str
    name: str = ""  # function_call
    arguments: str = ""  # function_call
    output: str = ""  # function_call_output
    previous_item_id: str | None = None
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ConversationItemTruncate(Command):
    item_id: str
    audio_end_ms: int
    content_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ConversationItemDelete(Command):
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ConversationItemRetrieve(Command):
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Close(Command):
    reason: str = "client_close"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EventAck(Command):
    """The client holds every event up to ``server_event_seq``: trim the replay journal."""

    server_event_seq: int
