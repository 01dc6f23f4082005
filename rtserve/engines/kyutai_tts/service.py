"""What a transport needs of a streaming text-to-speech engine (``WS /api/tts_streaming``):
torch-free, so ``web/`` can name it (docs/design.md#layers)."""

from __future__ import annotations

from typing import Protocol

from rtserve.engines.kyutai_tts.stream import TTSStream


class TTSStreamEngine(Protocol):
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

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> TTSStream:
        """A stream with ``voice``: ``EngineError`` (``voice_not_found``, ``engine_unavailable``)
        or ``CapacityExhausted`` before any slot is held."""
        ...
