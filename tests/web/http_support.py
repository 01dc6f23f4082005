"""Support for the HTTP generation route tests: test doubles of the turn engines, the
app served on a real socket, and the official OpenAI SDK client pointed at it.

They implement the engine protocols exactly (streamed, cancellable), so the routes'
parsing, streaming, limits and error paths are tested without models. Each records what
it was asked and whether its iterator was closed; ``hold`` pauses it after the first
item until the test releases it; ``fail_after`` raises an ``EngineError`` mid-stream.
Real-model tests (``@pytest.mark.models``) exercise the cascade engines instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import av
import numpy as np
import openai

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import EngineSession, HostedSessionEngine, SleepStage, TurnEngines
from rtserve.engines.values import (
    ChatMessage,
    EngineCapabilities,
    Pcm,
    SamplingParams,
    SessionOptions,
    TokenDelta,
    TranscriptPiece,
    VoiceInfo,
)
from rtserve.web.route_engine import route_engines
from tests.support import serve_app


@dataclass
class StreamControl:
    """What a test can do to, and learn from, one double's streams."""

    hold: asyncio.Event | None = None  # when set by the test, streams continue past their first item
    fail_after: int | None = None  # raise EngineError after this many items
    fail_code: str = "engine_error"
    started: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    calls: int = 0

    async def gate(self, emitted: int) -> None:
        if self.fail_after is not None and emitted >= self.fail_after:
            raise EngineError("the double failed on purpose", code=self.fail_code)
        if emitted == 1 and self.hold is not None:
            await self.hold.wait()


class EchoLLMDouble:
    """Test double LLM: replies ``echo: <last user message>``, one word per delta."""

    model_name = "double-llm"

    def __init__(self) -> None:
        self.control = StreamControl()
        self.seen: list[tuple[tuple[ChatMessage, ...], SamplingParams]] = []

    async def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        self.control.calls += 1
        self.seen.append((tuple(messages), params))
        self.control.started.set()
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        words = ["echo:", *last_user.split()]
        prompt_tokens = sum(len(m.content.split()) for m in messages)
        try:
            for i, word in enumerate(words[: params.max_tokens]):
                await self.control.gate(i)
                finish: Literal["stop", "length"] | None = None
                if i == len(words) - 1:
                    finish = "stop"
                elif i == params.max_tokens - 1:
                    finish = "length"
                yield TokenDelta(
                    text=word if i == 0 else " " + word,
                    finish_reason=finish,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=i + 1,
                )
                await asyncio.sleep(0)
        finally:
            self.control.closed.set()


class ToneTTSDouble:
    """Test double TTS at 16 kHz: one 0.1 s sine per word (frequency by voice), scaled by speed."""

    model_name = "double-tts"
    sample_rate = 16000
    voices: tuple[str, ...] = ("low", "high")
    FREQUENCIES: ClassVar[dict[str, float]] = {"low": 300.0, "high": 1200.0}
    WORD_SECONDS = 0.1

    def __init__(self) -> None:
        self.control = StreamControl()

    async def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncGenerator[Pcm, None]:
        self.control.calls += 1
        if voice is not None and voice not in self.voices:
            raise EngineError(f"unknown voice {voice!r}; this double speaks with low, high", code="invalid_voice")
        self.control.started.set()
        freq = self.FREQUENCIES[voice or "low"]
        n = int(self.sample_rate * self.WORD_SECONDS / speed)
        tone = (0.5 * np.sin(2 * np.pi * freq * np.arange(n) / self.sample_rate)).astype(np.float32)
        try:
            for i, _ in enumerate(text.split()):
                await self.control.gate(i)
                yield tone.copy()
                await asyncio.sleep(0)
        finally:
            self.control.closed.set()

    async def voice_list(self) -> list[VoiceInfo]:
        return [VoiceInfo(name, builtin=True, sample_rate=self.sample_rate) for name in self.voices]

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        raise EngineError("this double cannot register voices", code="voice_registration_unsupported")

    async def remove_voice(self, name: str) -> None:
        raise EngineError(f"{name!r} is built in", code="voice_not_deletable", param="name")


class ToneASRDouble:
    """Test double ASR at 16 kHz: "hears" the dominant frequency of each second of audio.

    Like a re-decoding ASR, each partial piece is the whole transcript so far (one word
    per complete second, ``"500hz 500hz"``); the final piece also counts a shorter tail.
    Decoding and resampling of an upload show in the text: a wrong rate or channel layout
    changes the frequency heard. ``fed`` records the size of every audio chunk received.
    """

    model_name = "double-asr"
    sample_rate = 16000

    def __init__(self) -> None:
        self.control = StreamControl()
        self.languages: list[str | None] = []
        self.prompts: list[str | None] = []
        self.fed: list[int] = []

    def _words(self, audio: np.ndarray, with_tail: bool) -> str:
        second = self.sample_rate
        end = audio.size if with_tail else audio.size // second * second
        words = []
        for start in range(0, end, second):
            frame = audio[start : min(start + second, end)]
            hz = round(float(np.argmax(np.abs(np.fft.rfft(frame)))) * self.sample_rate / frame.size, -1)
            words.append(f"{hz:.0f}hz")
        return " ".join(words)

    async def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncGenerator[TranscriptPiece, None]:
        self.control.calls += 1
        self.languages.append(language)
        self.prompts.append(prompt)
        self.control.started.set()
        heard = np.zeros(0, dtype=np.float32)
        emitted = 0
        try:
            async for chunk in audio:
                self.fed.append(chunk.size)
                heard = np.concatenate([heard, chunk])
                if text := self._words(heard, with_tail=False):
                    await self.control.gate(emitted)
                    emitted += 1
                    yield TranscriptPiece(text=text, final=False)
            await self.control.gate(emitted)
            yield TranscriptPiece(text=self._words(heard, with_tail=True), final=True)
        finally:
            self.control.closed.set()


class TurnEnginesSessionDouble:
    """Test double ``HostedSessionEngine`` that lends the three turn doubles (``turn_engines()``)."""

    capabilities = EngineCapabilities(
        name="double",
        mode="turn",
        input_sample_rate=24000,
        output_sample_rate=24000,
        chunk_period_ms=20,
        max_sessions=1,
        supports_barge_in=False,
    )

    def __init__(self) -> None:
        self.asr = ToneASRDouble()
        self.llm = EchoLLMDouble()
        self.tts = ToneTTSDouble()
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        self._ready = True

    async def open_session(self, session_id: str, options: SessionOptions) -> EngineSession:  # pragma: no cover
        raise NotImplementedError("the HTTP routes never open sessions")

    async def stop(self) -> None:
        self._ready = False

    def model_ids(self) -> list[str]:
        return ["double"]

    def turn_engines(self) -> TurnEngines:
        return TurnEngines(asr=self.asr, llm=self.llm, tts=self.tts)

    def sleep_stages(self) -> Sequence[SleepStage]:
        return ()


class NoTurnEnginesDouble:
    """Test double ``HostedSessionEngine`` that lends no turn engines (a lockstep-only engine)."""

    capabilities = EngineCapabilities(
        name="frames-only",
        mode="lockstep",
        input_sample_rate=24000,
        output_sample_rate=24000,
        chunk_period_ms=80,
        max_sessions=1,
        supports_barge_in=False,
    )
    ready = True

    async def start(self) -> None:
        pass

    async def open_session(self, session_id: str, options: SessionOptions) -> EngineSession:  # pragma: no cover
        raise NotImplementedError("not used by the HTTP routes")

    async def stop(self) -> None:
        pass

    def model_ids(self) -> list[str]:
        return ["frames-only"]

    def turn_engines(self) -> TurnEngines:
        return TurnEngines()

    def sleep_stages(self) -> Sequence[SleepStage]:
        return ()


if TYPE_CHECKING:
    # `make check` runs mypy over this module: each double stays what build_app takes.
    _conforms: tuple[HostedSessionEngine, ...] = (TurnEnginesSessionDouble(), NoTurnEnginesDouble())


@contextlib.asynccontextmanager
async def serve_doubles(
    config: ServerConfig, engine: TurnEnginesSessionDouble | None = None
) -> AsyncIterator[tuple[str, TurnEnginesSessionDouble]]:
    """The app over the doubles on 127.0.0.1:<ephemeral>, models "loaded" before the first request
    (the routes' own engines too, which start in the background: /health is "ok")."""
    engine = engine or TurnEnginesSessionDouble()
    await engine.start()
    app = build_app(config, engine=engine)
    async with serve_app(app) as base:
        async with asyncio.timeout(30):
            while any(not owned.ready and owned.failure is None for owned in route_engines(app).values()):
                await asyncio.sleep(0.01)
        yield base, engine


def sdk(base: str, api_key: str = "x") -> openai.OpenAI:
    """The official client, unchanged; no retries so a 429/503 reaches the test. Call it
    through ``asyncio.to_thread``: it blocks, and the server shares this event loop."""
    return openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0, timeout=60)


def tone(freq: float, seconds: float, rate: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def audio_file(
    container: str, codec: str, rate: int, channels: int = 1, seconds: float = 2.0, hz: float = 500.0
) -> bytes:
    """``seconds`` of a ``hz`` tone encoded by PyAV into ``container``."""
    pcm = tone(hz, seconds, rate)
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as c:
        stream = c.add_stream(codec, rate=rate, layout="stereo" if channels == 2 else "mono")
        assert isinstance(stream, av.AudioStream)
        interleaved = np.repeat(pcm, channels)[None, :]  # packed: L0 R0 L1 R1 ...
        frame = av.AudioFrame.from_ndarray(interleaved, format="flt", layout=stream.layout.name)
        frame.sample_rate = rate
        convert = av.AudioResampler(format=stream.codec_context.format.name, layout=stream.layout.name, rate=rate)
        for converted in [*convert.resample(frame), *convert.resample(None)]:
            for packet in stream.encode(converted):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    return out.getvalue()
