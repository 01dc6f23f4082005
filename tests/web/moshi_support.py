"""Shared by the Moshi route tests: the real app on 127.0.0.1 over the loopback engine,
and a Moshi-protocol client built on ``sphn``'s Ogg-Opus stream writer/reader."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np
import sphn
from prometheus_client import CollectorRegistry

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.events import EngineEvent
from rtserve.engines.lockstep import LockstepSessionEngine, SystemTickClock
from rtserve.engines.protocols import EngineSession, HostedSessionEngine, SessionEngine, SleepStage, TurnEngines
from rtserve.engines.reference import LoopbackModel
from rtserve.engines.registry import create_engine
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import Pcm, ResponseRequest, SessionOptions
from tests.support import serve_app

RATE = 24_000
FRAME = 1920  # 80 ms
WAIT_S = 10.0  # bound on every wait in these tests


def moshi_config(
    config: ServerConfig, *, batch_size: int = 4, delay_frames: int = 1, backlog_ms: float = 320.0, **moshi: object
) -> ServerConfig:
    return config.model_copy(
        update={
            "engine": "loopback",
            "lockstep": config.lockstep.model_copy(
                update={"batch_size": batch_size, "max_input_backlog_ms": backlog_ms}
            ),
            "reference": config.reference.model_copy(update={"loopback_delay_frames": delay_frames}),
            "moshi": config.moshi.model_copy(update=moshi),
        }
    )


class HeldTickClock(SystemTickClock):
    """Real time, except that the engine's second tick waits for ``release()``.

    The first tick opens the slot (the handshake waits for it) and steps it once on
    silence; time does not move while held, so the schedule resumes at the release. Lets a
    test queue input before the engine's next step: output position = one silent frame +
    the loopback delay, exactly.
    """

    def __init__(self) -> None:
        self._go = threading.Event()
        self._offset = 0.0
        self._ticks = 0

    def monotonic(self) -> float:
        return time.monotonic() - self._offset

    def sleep_until(self, deadline: float) -> None:
        self._ticks += 1
        if self._ticks > 1 and not self._go.is_set():
            held_from = time.monotonic()
            self._go.wait(WAIT_S)
            self._offset += time.monotonic() - held_from
        super().sleep_until(deadline + self._offset)

    def release(self) -> None:
        self._go.set()


def held_loopback_engine(
    config: ServerConfig, registry: CollectorRegistry, clock: HeldTickClock
) -> LockstepSessionEngine:
    """The registry's loopback engine, built by hand only to give it ``clock``."""
    model = LoopbackModel(config.lockstep.batch_size, config.reference.loopback_delay_frames)
    return LockstepSessionEngine("loopback", model, config, registry, supports_text_output=False, clock=clock)


class RecordingEngine:
    """Delegates to a real engine and records the options and closes of its sessions."""

    def __init__(self, inner: HostedSessionEngine) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        self.opened: list[SessionOptions] = []
        self.closed = 0

    @property
    def ready(self) -> bool:
        return self.inner.ready

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def model_ids(self) -> list[str]:
        return self.inner.model_ids()

    def turn_engines(self) -> TurnEngines:
        return self.inner.turn_engines()

    def sleep_stages(self) -> Sequence[SleepStage]:
        return self.inner.sleep_stages()

    async def open_session(self, session_id: str, options: SessionOptions) -> EngineSession:
        session = await self.inner.open_session(session_id, options)
        self.opened.append(options)
        return _CountedCloses(session, self)


class _CountedCloses:
    """An engine session exactly as the engine's own, except that it counts its ``close`` calls."""

    def __init__(self, inner: EngineSession, engine: RecordingEngine) -> None:
        self.inner = inner
        self.engine = engine
        self.capabilities = inner.capabilities

    def push_audio(self, pcm: Pcm) -> None:
        self.inner.push_audio(pcm)

    async def commit_input(self) -> None:
        await self.inner.commit_input()

    def clear_input(self) -> None:
        self.inner.clear_input()

    async def drain(self) -> None:
        await self.inner.drain()

    def respond(self, request: ResponseRequest) -> None:
        self.inner.respond(request)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def configure_turn_detection(self, settings: TurnDetection | None) -> None:
        self.inner.configure_turn_detection(settings)

    def events(self) -> AsyncGenerator[EngineEvent, None]:
        return self.inner.events()

    async def close(self) -> None:
        self.engine.closed += 1
        await self.inner.close()


@dataclass
class Server:
    base: str
    registry: CollectorRegistry
    engine: SessionEngine

    def ws_url(self, route: str) -> str:
        return self.base.replace("http://", "ws://") + route

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def wait_metric(self, name: str, at_least: float, **labels: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.metric(name, **labels) < at_least:
            assert time.monotonic() < deadline, f"{name}{labels} stayed below {at_least}"
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def moshi_server(
    config: ServerConfig, engine: HostedSessionEngine | None = None, registry: CollectorRegistry | None = None
) -> AsyncIterator[Server]:
    registry = registry or CollectorRegistry()
    engine = engine or create_engine("loopback", config, registry)
    async with serve_app(build_app(config, engine=engine, registry=registry)) as base:
        deadline = time.monotonic() + WAIT_S
        while not engine.ready:
            assert time.monotonic() < deadline, "engine did not start"
            await asyncio.sleep(0.01)
        yield Server(base, registry, engine)


def noise_signal(frames: int, seed: int = 0, amplitude: float = 0.25) -> np.ndarray:
    """Band-limited noise (150-4000 Hz): survives Opus and correlates at one sharp lag."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(frames * FRAME))
    freqs = np.fft.rfftfreq(frames * FRAME, 1 / RATE)
    spectrum[(freqs < 150) | (freqs > 4000)] = 0
    signal = np.fft.irfft(spectrum, frames * FRAME)
    return (amplitude * signal / np.abs(signal).max()).astype(np.float32)


def best_lag(output: np.ndarray, reference: np.ndarray, max_lag: int) -> tuple[int, float]:
    """The lag (samples) at which ``reference`` best matches ``output``, and the normalized score."""
    n = len(reference)
    size = 1 << int(np.ceil(np.log2(len(output) + n)))
    corr = np.fft.irfft(np.fft.rfft(output, size) * np.conj(np.fft.rfft(reference, size)), size)[: max_lag + 1]
    lag = int(np.argmax(corr))
    window = output[lag : lag + n]
    score = float(
        np.dot(window, reference[: len(window)])
        / (np.linalg.norm(window) * np.linalg.norm(reference[: len(window)]) + 1e-12)
    )
    return lag, score


class MoshiClient:
    """What Moshi's own clients do: sphn Ogg-Opus writer out, sphn reader in."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._writer = sphn.OpusStreamWriter(RATE)
        self._reader = sphn.OpusStreamReader(RATE)
        self.audio: list[np.ndarray] = []
        self.audio_messages = 0
        self.text: list[str] = []
        self.pre_skip_24k = 0  # what our stream's OpusHead tells a reader to drop, at 24 kHz

    async def handshake(self) -> None:
        message = await self.ws.receive(timeout=WAIT_S)
        assert message.type is aiohttp.WSMsgType.BINARY and message.data == b"\x00", message

    async def send_pcm(self, pcm: np.ndarray) -> None:
        for start in range(0, len(pcm), FRAME):
            frame = np.zeros(FRAME, np.float32)
            chunk = pcm[start : start + FRAME]
            frame[: len(chunk)] = chunk
            data = self._writer.append_pcm(frame)
            if data.startswith(b"OggS\x00\x02"):  # the BOS page: OpusHead follows the 28-byte header
                self.pre_skip_24k = struct.unpack_from("<H", data, 28 + 10)[0] * RATE // 48_000
            if data:
                await self.ws.send_bytes(b"\x01" + data)

    async def receive_audio(self, samples: int) -> np.ndarray:
        """Read until ``samples`` of agent audio were decoded."""
        while sum(map(len, self.audio)) < samples:
            message = await self.ws.receive(timeout=WAIT_S)
            assert message.type is aiohttp.WSMsgType.BINARY, message
            tag, payload = message.data[0], message.data[1:]
            if tag == 1:
                self.audio_messages += 1
                pcm = self._reader.append_bytes(payload)
                if pcm is not None and len(pcm):
                    self.audio.append(pcm)
            elif tag == 2:
                self.text.append(payload.decode("utf-8", "replace"))
        return np.concatenate(self.audio)


async def expect_close(ws: aiohttp.ClientWebSocketResponse) -> tuple[int | None, str]:
    """Drain until the server closes; return (close code, reason)."""
    while True:
        message = await ws.receive(timeout=WAIT_S)
        if message.type is aiohttp.WSMsgType.CLOSE:
            return message.data, message.extra or ""
        if message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
            return ws.close_code, ""
