"""A deterministic TEST DOUBLE of the engine seam (``SessionEngine`` / ``EngineSession``).

It is not an engine: it records every call the session core makes and emits exactly the
engine events a test tells it to (``emit`` / ``audio`` / ``finish``), so tests can
script races (late output of an old epoch, a hung cleanup, a failing commit). In
``lockstep`` mode it behaves like the lockstep engines: each complete input frame
produces one output frame (half the input, text on even frames), ``commit_input()``
steps the zero-padded partial tail, and ``close()`` discards whatever was not read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from rtserve.engines.errors import CapacityExhausted
from rtserve.engines.events import EngineEvent, InputTranscript, OutputAudio, ResponseFinished
from rtserve.engines.protocols import HostedSessionEngine, SleepStage, TurnEngines
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import EngineCapabilities, Pcm, ResponseRequest, SessionOptions


class TestDoubleEngineSession:
    """An ``EngineSession`` (checked by mypy, below)."""

    __test__ = False  # not a pytest class

    def __init__(self, engine: TestDoubleEngine, session_id: str, options: SessionOptions) -> None:
        self.engine = engine
        self.capabilities = engine.capabilities
        self.session_id = session_id
        self.options = options
        self.pushed: list[np.ndarray] = []
        self.commits = 0
        self.drains = 0
        self.clears = 0
        self.responses: list[ResponseRequest] = []
        self.epochs: list[int] = []
        self.epoch = 0
        self.close_calls = 0
        self.closed = False
        self.transcript_on_commit: str | None = "hello there"
        self.commit_error: Exception | None = None
        self.push_error: Exception | None = None  # push_audio() raises it (and keeps raising)
        self.commit_gate: asyncio.Event | None = None
        self.close_failures = engine.close_failures  # how many close() calls raise first
        self.close_hangs = engine.close_hangs
        self.close_gate: asyncio.Event | None = engine.close_gate  # close() waits for it
        self.on_close: list[Callable[[], object]] = []  # run at the start of close() (to observe order)
        self.on_set_epoch: list[Callable[[], object]] = []
        self._queue: asyncio.Queue[EngineEvent | None] = asyncio.Queue()  # None: the stream ends
        self._partial = np.zeros(0, dtype=np.float32)
        self._frames = 0

    # -- EngineSession ------------------------------------------------------

    def _step_tail(self) -> None:
        if self._partial.size:
            tail = np.zeros(self.capabilities.input_frame_samples, dtype=np.float32)
            tail[: self._partial.size] = self._partial
            self._partial = np.zeros(0, dtype=np.float32)
            self._step(tail)

    async def drain(self) -> None:
        """Lockstep: the tail is stepped and its output queued at once (read by the pump)."""
        self.drains += 1
        if self.capabilities.mode == "lockstep":
            self._step_tail()

    def push_audio(self, pcm: Pcm) -> None:
        if self.push_error is not None:
            raise self.push_error
        self.pushed.append(pcm)
        if self.capabilities.mode == "lockstep":
            self._partial = np.concatenate([self._partial, pcm.astype(np.float32)])
            size = self.capabilities.input_frame_samples
            while self._partial.size >= size:
                frame, self._partial = self._partial[:size], self._partial[size:]
                self._step(frame)

    async def commit_input(self) -> None:
        self.commits += 1
        if self.capabilities.mode == "lockstep":
            self._step_tail()
            return
        if self.commit_gate is not None:
            await self.commit_gate.wait()
        if self.commit_error is not None:
            raise self.commit_error
        if self.transcript_on_commit is not None:
            self.emit(InputTranscript(self.transcript_on_commit, final=True))

    def clear_input(self) -> None:
        self.clears += 1

    def respond(self, request: ResponseRequest) -> None:
        self.responses.append(request)

    def set_epoch(self, epoch: int) -> None:
        for hook in self.on_set_epoch:
            hook()
        self.epochs.append(epoch)
        self.epoch = epoch

    def configure_turn_detection(self, settings: TurnDetection | None) -> None:
        pass  # the double has no VAD of its own: tests emit SpeechStarted/SpeechStopped

    async def events(self) -> AsyncGenerator[EngineEvent, None]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def close(self) -> None:
        self.close_calls += 1
        for hook in self.on_close:
            hook()
        if self.close_gate is not None:
            await self.close_gate.wait()
        if self.close_hangs:
            await asyncio.Event().wait()
        if self.close_failures > 0:
            self.close_failures -= 1
            raise RuntimeError("scripted cleanup failure")
        if not self.closed:
            self.closed = True
            while not self._queue.empty():  # a released session's unread output is never delivered
                self._queue.get_nowait()
            self._queue.put_nowait(None)
        self.engine.closed_sessions.append(self.session_id)

    # -- scripting helpers -------------------------------------------------

    def emit(self, event: EngineEvent) -> None:
        self._queue.put_nowait(event)

    def end_stream(self) -> None:
        """The engine drops the session on its own (its event stream ends)."""
        self._queue.put_nowait(None)

    def audio(
        self,
        response_id: str | None,
        samples: int = 480,
        *,
        text: str | None = None,
        epoch: int | None = None,
        value: float = 0.25,
    ) -> None:
        pcm = np.full(samples, value, dtype=np.float32)
        self.emit(OutputAudio(pcm, self.epoch if epoch is None else epoch, response_id, text))

    def finish(
        self,
        response_id: str,
        status: Literal["completed", "cancelled", "failed"] = "completed",
        epoch: int | None = None,
    ) -> None:
        self.emit(ResponseFinished(response_id, self.epoch if epoch is None else epoch, status))

    def _step(self, frame: np.ndarray) -> None:
        self._frames += 1
        text = "w" if self._frames % 2 == 0 else None
        self.emit(OutputAudio((frame * 0.5).astype(np.float32), self.epoch, None, text))


class TestDoubleEngine:
    """A ``HostedSessionEngine`` (checked by mypy, below)."""

    __test__ = False

    def __init__(
        self,
        *,
        mode: Literal["turn", "lockstep"] = "turn",
        max_sessions: int = 1024,
        supports_barge_in: bool = True,
        supports_server_vad: bool = True,
        supports_semantic_vad: bool = True,
        output_sample_rate: int = 24000,
        input_sample_rate: int = 24000,
        chunk_period_ms: int = 80,
    ) -> None:
        self.capabilities = EngineCapabilities(
            name=f"test-double-{mode}",
            mode=mode,
            input_sample_rate=input_sample_rate,
            output_sample_rate=output_sample_rate,
            chunk_period_ms=chunk_period_ms,
            max_sessions=max_sessions,
            supports_barge_in=supports_barge_in,
            supports_server_vad=supports_server_vad,
            supports_semantic_vad=supports_semantic_vad,
        )
        self.sessions: dict[str, TestDoubleEngineSession] = {}
        self.closed_sessions: list[str] = []
        self.open_gate: asyncio.Event | None = None
        self.open_error: Exception | None = None
        self.close_failures = 0
        self.close_hangs = False
        self.close_gate: asyncio.Event | None = None
        self._next_open_gates: list[asyncio.Event] = []

    def block_next_open(self) -> asyncio.Event:
        """The next ``open_session`` waits until the returned event is set."""
        gate = asyncio.Event()
        self._next_open_gates.append(gate)
        return gate

    @property
    def ready(self) -> bool:
        return True

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def turn_engines(self) -> TurnEngines:
        return TurnEngines()

    def sleep_stages(self) -> Sequence[SleepStage]:
        return ()

    def model_ids(self) -> list[str]:
        return [self.capabilities.name]

    async def open_session(self, session_id: str, options: SessionOptions) -> TestDoubleEngineSession:
        if self._next_open_gates:
            await self._next_open_gates.pop(0).wait()
        if self.open_gate is not None:
            await self.open_gate.wait()
        if self.open_error is not None:
            raise self.open_error
        live = sum(not s.closed for s in self.sessions.values())
        if live >= self.capabilities.max_sessions:
            raise CapacityExhausted("test double is full")
        session = TestDoubleEngineSession(self, session_id, options)
        self.sessions[session_id] = session
        return session


if TYPE_CHECKING:
    # `make check` runs mypy over this module: the double stays what build_app and SessionManager
    # take, and its open_session returns an EngineSession.
    _conforms: HostedSessionEngine = TestDoubleEngine()
