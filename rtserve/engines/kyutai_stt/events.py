"""What a speech-to-text stream tells its client, in the order it happens (the shape of
moshi-server's ``/api/asr-streaming`` messages, docs/engines.md#kyutai-stt-engine)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Word:
    """A word heard, once its last token is out; ``start_time`` in seconds of the stream's audio."""

    text: str
    start_time: float


@dataclass(frozen=True)
class EndWord:
    """The word before ended at ``stop_time`` (seconds of the stream's audio)."""

    stop_time: float


@dataclass(frozen=True)
class Step:
    """One model step of the stream: ``prs`` per extra head, the probability of its first class
    (Kyutai STT: the end of the speaker's turn); ``buffered_pcm`` samples received, not stepped yet."""

    step_idx: int
    prs: tuple[float, ...]
    buffered_pcm: int


@dataclass(frozen=True)
class Marker:
    """Every sample sent before the client's marker ``id`` has been transcribed."""

    id: int


SttEvent = Word | EndWord | Step | Marker
