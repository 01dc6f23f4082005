"""Helpers of the cascade model tests (imported by their package path, tests.engines.cascade.cascade_support)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.asr import WhisperAsr
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.llm_ct2 import Ct2Llm
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.events import EngineEvent
from rtserve.engines.protocols import EngineSession
from rtserve.engines.values import SessionOptions

QUESTION = "What is the capital of France?"
MAX_SESSIONS = 3
CHUNK = 480  # 30 ms at 16 kHz


@dataclass(frozen=True)
class Loaded:
    engine: CascadeEngine
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    @property
    def whisper(self) -> WhisperAsr:
        return whisper(self.engine)

    @property
    def piper(self) -> TextToSpeech:
        return piper(self.engine)


def whisper(engine: CascadeEngine) -> WhisperAsr:
    assert engine.asr is not None, "this cascade hears with the streaming STT"
    return engine.asr


def piper(engine: CascadeEngine) -> TextToSpeech:
    assert engine.tts is not None, "this cascade does not speak with Piper"
    return engine.tts


@dataclass(frozen=True)
class Float32Ct2:
    llm: Ct2Llm
    registry: CollectorRegistry


async def speak_16k(engine: CascadeEngine, text: str) -> np.ndarray:
    """``text`` spoken by the engine's own TTS, at the engine's 16 kHz input rate."""
    chunks = [chunk async for chunk in piper(engine).synthesize(text)]
    return resample(np.concatenate(chunks), piper(engine).sample_rate, engine.capabilities.input_sample_rate)


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:\"'").lower() for w in text.split()} - {""}


def heard_most_of(heard: str, said: str) -> bool:
    """Whether a transcript has at least half the words of what was said. Whisper tiny mishears a
    word now and then ("France" as "friends", more so on a loaded machine); a transcript of other
    audio, or of none, shares next to nothing with the sentence."""
    return 2 * len(words(heard) & words(said)) >= len(words(said))


class Recorder:
    """Collects a session's events in a task; ``wait_for`` returns once a matching one came."""

    def __init__(self, session: EngineSession) -> None:
        self.events: list[EngineEvent] = []
        self.on_event: Callable[[EngineEvent], None] | None = None
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read(session.events()))

    async def _read(self, events: AsyncIterator[EngineEvent]) -> None:
        async for event in events:
            self.events.append(event)
            if self.on_event is not None:
                self.on_event(event)
            self._new.set()

    async def wait_for(
        self,
        match: Callable[[EngineEvent], bool],
        timeout: float = 60,  # noqa: ASYNC109 - a test's deadline, applied with asyncio.timeout inside
    ) -> EngineEvent:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if match(event):
                        return event
                self._new.clear()
                await self._new.wait()

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


async def speak_into(session: EngineSession, audio: np.ndarray, *, silence_ms: int = 900) -> None:
    """Push like a live client: 30 ms chunks, roughly paced, then trailing silence."""
    padded = np.concatenate([audio, np.zeros(16 * silence_ms, np.float32)])
    for start in range(0, len(padded), CHUNK):
        session.push_audio(padded[start : start + CHUNK])
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def opened(cascade: Loaded, options: SessionOptions, name: str) -> AsyncIterator[EngineSession]:
    session = await cascade.engine.open_session(name, options)
    try:
        yield session
    finally:
        await session.close()
