"""What a transport needs of a streaming speech-to-text engine (``WS /api/asr-streaming``):
torch-free, so ``web/`` can name it (docs/design.md#layers)."""

from __future__ import annotations

from typing import Protocol

from rtserve.engines.kyutai_stt.stream import SttStream


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

    def open_stream(self, stream_id: str) -> SttStream:
        """A stream on a free slot, or ``CapacityExhausted`` / ``EngineError`` at once."""
        ...
