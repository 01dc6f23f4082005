"""What a transport needs of a streaming speech-to-text engine (``WS /api/asr-streaming``):
torch-free, so ``web/`` can name it (docs/design.md#layers)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from rtserve.engines.kyutai_stt.events import SttEvent
from rtserve.engines.values import Pcm


class SpeechStream(Protocol):
    """One client's stream (``SttStream`` on the Kyutai engine, ``WhisperSttStream`` on the
    embedded Whisper); called from the event loop."""

    @property
    def pending_markers(self) -> int: ...

    def push_audio(self, pcm: Pcm) -> None:
        """Queue float mono samples of any length; ``InvalidAudio`` for non-finite or misshapen ones."""
        ...

    def mark(self, marker_id: int, samples: int | None = None) -> None:
        """Answer ``Marker(marker_id)`` once everything sent so far (or its first ``samples``) is
        transcribed."""
        ...

    def flush(self) -> None:
        """Have what was sent so far transcribed, and the markers placed so far answered, as soon
        as the engine can instead of after its model's delay in real time (the end of a turn)."""
        ...

    def events(self) -> AsyncGenerator[SttEvent, None]: ...

    async def close(self, release_timeout_s: float) -> None: ...


class SpeechStreamEngine(Protocol):
    async def start(self) -> None:
        """Load the weights and start stepping; a failure is kept in ``failure``, not raised."""
        ...

    async def stop(self) -> None: ...

    @property
    def ready(self) -> bool:
        """Loaded and stepping: streams may open."""
        ...

    @property
    def failure(self) -> str | None:
        """Why it will not serve (its weights failed to load); None while fine."""
        ...

    @property
    def sample_rate(self) -> int: ...

    @property
    def release_timeout_s(self) -> float: ...

    async def open_stream(self, stream_id: str) -> SpeechStream:
        """A stream on a free slot, or ``CapacityExhausted`` / ``EngineError`` (the engine may be
        in another process: the engine link's ``RemoteSpeechStreams``)."""
        ...
