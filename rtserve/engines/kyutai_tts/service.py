"""What a transport needs of a streaming text-to-speech engine (``WS /api/tts_streaming``):
torch-free, so ``web/`` can name it (docs/design.md#layers). The Kyutai TTS engine is one
(``TTSStreamEngine``, with its lifecycle); Piper behind ``cascade/tts_stream.py`` is the other
(``SpeechStreams`` only: the app's turn-engine TTS, started and stopped with the app's engines)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from rtserve.engines.kyutai_tts.stream import SpeechEvent
from rtserve.engines.protocols import SleepStage


class SpeechStream(Protocol):
    """One client's stream: text in, word timings and audio out, in order."""

    @property
    def ended(self) -> bool:
        """The client's end of stream came."""
        ...

    def send_text(self, text: str) -> None:
        """More text to speak; ``EngineError`` after the end of stream or past the backlog bound."""
        ...

    def end(self) -> None:
        """No more text (the tail is spoken); a second end is an ``EngineError``."""
        ...

    def events(self) -> AsyncIterator[SpeechEvent]:
        """Words and audio until the speech is done; ``EngineError`` if it cannot go on."""
        ...

    async def close(self) -> None:
        """Release what the stream holds (idempotent)."""
        ...


class SpeechStreams(Protocol):
    """What the route opens streams on."""

    @property
    def sample_rate(self) -> int: ...

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> SpeechStream:
        """A stream with ``voice``: ``EngineError`` (``voice_not_found``, ``engine_unavailable``)
        or ``CapacityExhausted`` before any slot is held."""
        ...


class TTSStreamEngine(SpeechStreams, Protocol):
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


class SleepingSpeechStreams(SpeechStreams, SleepStage, Protocol):
    """A ``SpeechStreams`` engine that sleep mode can unload (the Kyutai TTS engine)."""


@runtime_checkable
class SpeaksWithStreams(Protocol):
    """A session engine that may speak its replies on a ``SpeechStreams`` engine (the cascade)."""

    def speak_with(self, streams: SleepingSpeechStreams) -> bool:
        """Offered the process's streaming TTS engine; True when its config makes it speak with it
        (the engine is then one of its sleep stages)."""
        ...
