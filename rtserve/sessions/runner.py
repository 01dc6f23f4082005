"""The per-session runner: the single writer of one session (docs/sessions.md#runner).

Everything that changes a session goes through one mailbox and is applied by one task,
in order: client commands (admitted by the manager), engine events (pumped from
``EngineSession.events()``), and internal items (commit completions, timers, stop
requests). The behaviour lives in small trackers the runner composes, each owning its
state: ``SessionOutput`` (stamping, overflow), ``InputLedger`` (uncommitted audio, turns
awaiting transcripts), ``ResponseTracker`` (the active response, the epoch fence),
``TurnTracker`` (commits, transcripts, server VAD) and ``CommandHandlers`` (client
commands, the session config). This module routes mailbox items to them, applies the
overflow policy (docs/sessions.md#overflow-policy), and owns the task lifecycle and the teardown that ends every
session with exactly one terminal event, queued after engine cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rtserve import errors
from rtserve.clock import Clock
from rtserve.config import SessionLimits
from rtserve.engines.errors import EngineError
from rtserve.engines.events import (
    EngineFailure,
    InputTranscript,
    OutputAudio,
    OutputText,
    OutputToolCall,
    ResponseFinished,
)
from rtserve.engines.events import SpeechStarted as EngineSpeechStarted
from rtserve.engines.events import SpeechStopped as EngineSpeechStopped
from rtserve.engines.protocols import EngineSession
from rtserve.engines.values import ChatMessage
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.attachment import SessionOutlet
from rtserve.sessions.backpressure import InputGate
from rtserve.sessions.command_handlers import CommandHandlers
from rtserve.sessions.conversation import Conversation
from rtserve.sessions.idle_timer import IdleTimeoutFired
from rtserve.sessions.inactivity import InactivityCheck, InactivityTimeout
from rtserve.sessions.input_ledger import InputLedger
from rtserve.sessions.mailbox import Mailbox
from rtserve.sessions.metrics import SessionMetrics
from rtserve.sessions.output import SessionOutput
from rtserve.sessions.responses import ResponseTracker
from rtserve.sessions.session_config import SessionConfig
from rtserve.sessions.turns import CommitFinished, TranscriptTimeout, TurnTracker
from rtserve.sessions.video_frames import FrameWindow

log = logging.getLogger(__name__)


_STOP = object()
_PUMP_ENDED = object()
_FAIR_BATCH = 16  # mailbox items applied before the runner yields to other tasks
ENGINE_EVENTS = (
    OutputAudio,
    OutputText,
    ResponseFinished,
    EngineSpeechStarted,
    EngineSpeechStopped,
    InputTranscript,
    EngineFailure,
    OutputToolCall,
)


class StopKind(StrEnum):
    """How a session ends; the value names the terminal event and labels the metric."""

    CLOSED = "closed"
    EXPIRED = "expired"


@dataclass(frozen=True)
class StopRequest:
    kind: StopKind
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


class SessionRunner:
    def __init__(
        self,
        *,
        session_id: str,
        engine: EngineSession,
        config: SessionConfig,
        limits: SessionLimits,
        outlet: SessionOutlet,
        clock: Clock,
        metrics: SessionMetrics,
        resumable: bool,
        on_closing: Callable[[SessionRunner, StopRequest], None],
        on_finished: Callable[[SessionRunner, bool], None],
    ) -> None:
        self.session_id = session_id
        self.engine = engine
        self.capabilities = engine.capabilities
        self.limits = limits
        self.outlet = outlet
        self.metrics = metrics
        self.resumable = resumable
        self._on_closing = on_closing
        self._on_finished = on_finished
        self.mailbox = Mailbox(limits.mailbox_size)
        self.gate = InputGate(limits.max_pending_input_bytes_per_session, limits.max_pending_turns_per_session)
        # The trackers, wired one way: output <- ledger <- responses <- turns <- commands. Each
        # gets only what it reads; the config is read through the runner (session.update replaces it).
        self._conversation = Conversation(
            max_items=limits.max_conversation_items,
            max_bytes=limits.max_conversation_bytes,
            max_images=limits.max_conversation_images,
        )
        self._frames = FrameWindow(limits.max_video_frames)
        self._output = SessionOutput(session_id, outlet.buffer, metrics, self._on_output_overflow)
        self._ledger = InputLedger()
        self._responses = ResponseTracker(
            engine=engine,
            capabilities=self.capabilities,
            config=lambda: self.config,
            conversation=self._conversation,
            output=self._output,
            ledger=self._ledger,
            stopping=lambda: self._stop is not None,
        )
        self._turns = TurnTracker(
            engine=engine,
            capabilities=self.capabilities,
            config=lambda: self.config,
            limits=limits,
            clock=clock,
            conversation=self._conversation,
            output=self._output,
            ledger=self._ledger,
            responses=self._responses,
            frames=self._frames,
            post=self.mailbox.post,
            spawn=self._spawn,
        )
        self._commands = CommandHandlers(
            engine=engine,
            capabilities=self.capabilities,
            config=config,
            limits=limits,
            conversation=self._conversation,
            output=self._output,
            ledger=self._ledger,
            responses=self._responses,
            turns=self._turns,
            frames=self._frames,
            snapshot=self.snapshot,
        )
        self._inactivity = InactivityTimeout(
            timeout_s=limits.inactivity_timeout_s,
            clock=clock,
            busy=self._busy,
            post=self.mailbox.post,
            spawn=self._spawn,
        )
        self.closing = False
        self.stop_request: StopRequest | None = None  # the first close/expiry asked for from outside
        self._stop: StopRequest | None = None  # why the mailbox loop ends (a request, overflow, engine end)
        self.terminal: StopRequest | None = None  # what the terminal event says, once decided
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._public_capabilities = self.capabilities.public()
        self._main: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self.close_task: asyncio.Task[None] | None = None
        self.finished: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    @property
    def config(self) -> SessionConfig:
        return self._commands.config

    @property
    def epoch(self) -> int:
        return self._output.epoch

    @property
    def history(self) -> tuple[ChatMessage, ...]:
        return self._conversation.history()

    @property
    def active_response_id(self) -> str | None:
        return self._responses.active_id

    def snapshot(self) -> ev.SessionSnapshot:
        return ev.SessionSnapshot(
            id=self.session_id,
            config=self.config,
            capabilities=self._public_capabilities,
            epoch=self.epoch,
            turn_id=self._ledger.turn_id,
            resumable=self.resumable,
        )

    def start(self, created: ev.SessionCreated) -> None:
        self._output.emit(created)
        loop = asyncio.get_running_loop()
        self._main = loop.create_task(self._run(), name=f"session-runner:{self.session_id}")
        self._pump = loop.create_task(self._pump_engine(), name=f"session-pump:{self.session_id}")
        self._inactivity.start()

    def offer(self, command: cmd.Command) -> bool:
        """Queue an admitted command; False when the mailbox is full."""
        return self.mailbox.offer(command)

    def request_stop(self, kind: StopKind, reason: str, details: dict[str, Any] | None = None) -> asyncio.Future[bool]:
        """Close or expire the session; only the first request counts. The future
        resolves (with whether engine cleanup succeeded) after the terminal event is queued."""
        if self.stop_request is None:
            self.stop_request = StopRequest(kind, reason, details or {})
            self.mailbox.post(_STOP)
        return self.finished

    def cancel_tasks(self) -> list[asyncio.Task[Any]]:
        """Hard stop (shutdown past its deadline); returns the tasks to await."""
        tasks = [t for t in (self._main, self._pump, *self._side_tasks) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        return tasks

    async def _run(self) -> None:
        applied = 0
        try:
            while self._stop is None:
                applied += 1
                if applied % _FAIR_BATCH == 0:
                    await asyncio.sleep(0)  # a long backlog must not starve other sessions or consumers
                item = await self.mailbox.get()
                if item is _STOP:
                    self._stop = self.stop_request
                elif isinstance(item, cmd.Command):
                    self.gate.release(item)
                    self._inactivity.on_activity()
                    self._guarded(self._commands.apply, item)
                elif item is _PUMP_ENDED:
                    self._stop = StopRequest(StopKind.CLOSED, "engine_closed")
                else:
                    self._guarded(self._on_internal, item)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must end this session only, cleanly
            log.exception("session runner failed")
            self._stop = StopRequest(StopKind.CLOSED, errors.INTERNAL_ERROR)
        try:
            await self._teardown()
        except Exception:
            # Still end the stream; the slot stays held (cleanup did not verifiably happen).
            log.exception("session teardown failed")
            self._finish(False)

    def _guarded(self, handler: Callable[[Any], None], item: Any) -> None:
        related = getattr(item, "event_id", None)
        try:
            handler(item)
        except EngineError as exc:
            self._output.error(exc.code, str(exc), error_type=errors.SERVER_ERROR, related=related)
        except Exception:
            log.exception("failed to apply %s", type(item).__name__)
            self._output.error(
                errors.INTERNAL_ERROR,
                "The server failed to apply this event",
                error_type=errors.SERVER_ERROR,
                related=related,
            )

    def _on_internal(self, item: Any) -> None:
        if isinstance(item, ENGINE_EVENTS):
            self._on_engine_event(item)
        elif isinstance(item, CommitFinished):
            self._turns.on_commit_finished(item)
        elif isinstance(item, TranscriptTimeout):
            self._turns.on_transcript_timeout(item)
        elif isinstance(item, IdleTimeoutFired):
            self._turns.on_idle_timeout(item)
        elif isinstance(item, InactivityCheck) and self._inactivity.expired():
            self._end_inactive()

    def _busy(self) -> bool:
        """Work in progress or output unsent: the inactivity timeout is held."""
        active = self._responses.active
        return (
            (active is not None and not active.continuous)
            or bool(self._ledger.awaiting_transcripts)
            or self.outlet.buffer.pending_events > 0
        )

    def _end_inactive(self) -> None:
        """No client event, no work and no unsent output for ``sessions.inactivity_timeout_s``:
        the error says why, then the session expires and its slot is freed."""
        timeout_s = self._inactivity.timeout_s
        self._output.error(
            errors.SESSION_IDLE_TIMEOUT,
            f"The session had no client events and no output for {timeout_s:g} s and was closed; "
            "open a new session to continue",
            error_type=errors.INVALID_REQUEST_ERROR,
        )
        self._stop = StopRequest(StopKind.EXPIRED, errors.SESSION_IDLE_TIMEOUT, {"inactivity_timeout_s": timeout_s})

    def _on_engine_event(self, e: Any) -> None:
        if isinstance(e, OutputAudio | OutputText | ResponseFinished | OutputToolCall):
            answering = self._responses.active
            if not self._responses.on_output(e):
                self.metrics.stale_outputs.inc()
            elif isinstance(e, OutputAudio):
                self._turns.idle.on_agent_audio()
            elif isinstance(e, ResponseFinished) and answering is not None and not answering.continuous:
                self._inactivity.on_activity()
                self._turns.on_response_finished(e.status, answering.item.audio_ms)
        elif isinstance(e, EngineSpeechStarted):
            self._turns.on_speech_started(e)
        elif isinstance(e, EngineSpeechStopped):
            self._turns.on_speech_stopped(e)
        elif isinstance(e, InputTranscript):
            self._turns.on_input_transcript(e)
        elif isinstance(e, EngineFailure):
            self._output.error(e.code, e.message, error_type=errors.SERVER_ERROR)

    def _on_output_overflow(self) -> None:
        """The rest of the overflow policy (docs/sessions.md#overflow-policy): the active response fails and leaves
        history, the error and the failed ``response.done`` use the reserve, and the session
        closes with ``output_backpressure``."""
        response = self._responses.fail_for_overflow()
        self._output.emit_reserve(
            ev.ErrorEvent(
                session_id=self.session_id,
                code=errors.OUTPUT_BACKPRESSURE,
                error_type=errors.RATE_LIMIT_ERROR,
                message="The client is not reading output fast enough; the session is closed",
            )
        )
        if response is not None and response.announced and not response.ending_queued:
            self._output.emit_reserve(
                ev.ResponseDone(
                    session_id=self.session_id,
                    response_id=response.id,
                    status="failed",
                    status_details={"type": "failed", "reason": errors.OUTPUT_BACKPRESSURE},
                    output=(response.item.snapshot(),),
                    committed=False,
                )
            )
        if self._stop is None:
            self._stop = StopRequest(StopKind.CLOSED, errors.OUTPUT_BACKPRESSURE)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def _pump_engine(self) -> None:
        try:
            async for item in self.engine.events():
                await self.mailbox.put(item)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("engine event stream failed")
            self.mailbox.post(EngineFailure(errors.ENGINE_ERROR, "The engine stopped serving this session"))
        self.mailbox.post(_PUMP_ENDED)

    async def _teardown(self) -> None:
        stop = self.terminal = self._stop or StopRequest(StopKind.CLOSED, errors.INTERNAL_ERROR)
        self.closing = True
        self._on_closing(self, stop)
        for item in self.mailbox.drain():
            if isinstance(item, cmd.Command):
                self.gate.release(item)
        for task in list(self._side_tasks):
            task.cancel()
        self._responses.cut_off(stop.reason)  # before the engine is released
        continuous = self._responses.continuous
        if continuous and self._responses.active is not None and not self._output.failed:
            await self._flush_lockstep_tail()
        cleanup_ok = await self.close_engine()
        if continuous:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drain_engine_output(), self.limits.engine_close_timeout_s)
            if self._responses.active is not None and not self._output.failed:
                self._responses.end("completed")
        await self._stop_pump()
        if self._side_tasks:
            await asyncio.gather(*self._side_tasks, return_exceptions=True)
        self._finish(cleanup_ok)

    def _finish(self, cleanup_ok: bool) -> None:
        """Queue the one terminal event. The slot is released first (when cleanup
        succeeded): a client that reopens right after session.closed must be admitted."""
        if self.finished.done():
            return
        stop = self.terminal or StopRequest(StopKind.CLOSED, errors.INTERNAL_ERROR)
        self._on_finished(self, cleanup_ok)
        terminal_cls = ev.SessionExpired if stop.kind is StopKind.EXPIRED else ev.SessionClosed
        self.outlet.buffer.close(
            terminal_cls(session_id=self.session_id, epoch=self.epoch, reason=stop.reason, details=stop.details)
        )
        self.finished.set_result(cleanup_ok)

    async def close_engine(self) -> bool:
        """One bounded cleanup attempt; a hung ``close()`` keeps running in the background
        and is awaited again by the reaper's retries."""
        if self.close_task is None or (self.close_task.done() and not _succeeded(self.close_task)):
            self.close_task = asyncio.get_running_loop().create_task(self.engine.close())
        if not self.close_task.done():
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self.close_task), self.limits.engine_close_timeout_s)
        ok = _succeeded(self.close_task)
        if not ok and self.close_task.done():
            log.warning("engine session cleanup failed: %r", self.close_task.exception())
        return ok

    async def _flush_lockstep_tail(self) -> None:
        """Lockstep close never drops input: the engine's ``drain`` returns once every pushed
        sample was stepped (a partial tail zero-padded) and the pump read the answer to it;
        what the pump forwards meanwhile is applied as it comes."""
        drained = asyncio.get_running_loop().create_task(self.engine.drain())
        try:
            await asyncio.wait_for(self._drain_engine_output(until=drained), self.limits.engine_close_timeout_s)
            drained.result()
        except (TimeoutError, Exception):
            log.warning("lockstep tail flush did not finish; closing without it", exc_info=True)
        finally:
            drained.cancel()
            await asyncio.gather(drained, return_exceptions=True)

    async def _drain_engine_output(self, until: asyncio.Future[None] | None = None) -> None:
        """Apply engine output the pump forwards until ``until`` is done (then what it already
        forwarded), or, without ``until``, until the pump ended (the engine closed its events)."""
        loop = asyncio.get_running_loop()
        while True:
            if not len(self.mailbox) and (
                (until is not None and until.done()) or self._pump is None or self._pump.done()
            ):
                return
            getter = loop.create_task(self.mailbox.get())
            await asyncio.wait({getter} if until is None else {getter, until}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()  # ``until`` finished first; a cancelled get takes no item
                await asyncio.gather(getter, return_exceptions=True)
                if getter.cancelled():
                    continue
            item = getter.result()
            if item is _PUMP_ENDED:
                return
            if isinstance(item, ENGINE_EVENTS):
                self._guarded(self._on_engine_event, item)
            elif isinstance(item, cmd.Command):
                self.gate.release(item)

    async def _stop_pump(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        for item in self.mailbox.drain():
            if isinstance(item, cmd.Command):
                self.gate.release(item)


def _succeeded(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None
