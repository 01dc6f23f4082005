"""SessionManager: admission, command dispatch, detach/resume, expiry and shutdown.

Admission is a synchronous check-and-reserve of one of ``max_sessions`` slots, so
concurrent opens can never exceed it; a full server refuses at once with
``resource_exhausted`` (never a queue). A session keeps its slot while it closes and
until its engine cleanup succeeds: the terminal event is queued after the cleanup
attempt, and a failed cleanup is retried by the reaper without new events.

Dispatch order (docs/sessions.md#command-dispatch): unknown or closing session -> ``unknown_session``
(returned, and given to the orphan sink: no stream exists for it); input backpressure or
a full mailbox -> ``input_backpressure`` (also queued on the session's own stream);
otherwise the command goes to the runner's mailbox and refreshes the lease. Nothing here
awaits one session on behalf of another: per-session order comes from each runner's
mailbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry

from rtserve import errors
from rtserve.clock import Clock, SystemClock
from rtserve.config import SessionLimits
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.protocols import SessionEngine
from rtserve.engines.values import SessionOptions, SlotPrompt
from rtserve.log import session_id_var
from rtserve.sessions import commands as cmd
from rtserve.sessions.attachment import Attachment, SessionOutlet
from rtserve.sessions.buffer import OutputBuffer
from rtserve.sessions.errors import OutputOverflowError, SessionError
from rtserve.sessions.events import (
    ErrorEvent,
    ResyncRequired,
    SessionClosed,
    SessionCreated,
    SessionEvent,
    SessionResumed,
)
from rtserve.sessions.handle import SessionHandle
from rtserve.sessions.ids import new_session_id
from rtserve.sessions.journal import ReplayJournal
from rtserve.sessions.lease import DETACHED_LIMIT, MAX_DURATION_REACHED, Lease, unknown_session
from rtserve.sessions.metrics import SessionMetrics
from rtserve.sessions.projections.base import Projection
from rtserve.sessions.projections.realtime import RealtimeProjection
from rtserve.sessions.responses import sampling_for
from rtserve.sessions.runner import SessionRunner, StopKind
from rtserve.sessions.session_config import SessionConfig

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_P = ParamSpec("_P")


class _EntryState(enum.Enum):
    """live -> closing -> (cleanup_pending) -> released"""

    LIVE = enum.auto()
    CLOSING = enum.auto()
    CLEANUP_PENDING = enum.auto()  # engine cleanup failed: the slot stays held until a retry succeeds
    RELEASED = enum.auto()


@dataclass(eq=False)
class _Entry:
    session_id: str
    runner: SessionRunner
    outlet: SessionOutlet
    lease: Lease
    state: _EntryState = _EntryState.LIVE


class SessionManager:
    def __init__(
        self,
        engine: SessionEngine,
        limits: SessionLimits | None = None,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        orphan_sink: Callable[[SessionEvent], None] | None = None,
        owner: str | None = None,
    ) -> None:
        """``owner``: this front-end's tag, carried in every session id (``ids.new_session_id``)."""
        self.engine = engine
        self.owner = owner
        self.limits = limits or SessionLimits()
        self.clock = clock or SystemClock()
        self.metrics = SessionMetrics(registry if registry is not None else CollectorRegistry())
        self.orphan_sink = orphan_sink
        self._live: dict[str, _Entry] = {}
        self._closing: dict[str, _Entry] = {}
        self._opening = 0
        self._opening_ids: set[str] = set()  # client-named sessions being opened
        self._background: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._shutting_down = False
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------
    # observation
    # ------------------------------------------------------------------

    def active_count(self) -> int:
        """Sessions holding an admission slot (opening, live, or closing)."""
        return self._opening + len(self._live) + len(self._closing)

    def stats(self) -> dict[str, int]:
        return {
            "opening": self._opening,
            "live": len(self._live),
            "closing": len(self._closing),
            "cleanup_pending": sum(e.state is _EntryState.CLEANUP_PENDING for e in self._closing.values()),
            "background_tasks": len(self._background),
        }

    def get(self, session_id: str) -> SessionHandle | None:
        """The handle of a live session; None once it is closing or gone."""
        entry = self._live.get(session_id)
        return None if entry is None else SessionHandle(self, entry.runner, entry.lease)

    # ------------------------------------------------------------------
    # open
    # ------------------------------------------------------------------

    async def open(
        self,
        config: SessionConfig | None = None,
        *,
        projection: Projection | None = None,
        resumable: bool = True,
        session_id: str | None = None,
        route: str = "",
    ) -> SessionHandle:
        """Admit and open a session. The handle's ``attachment`` is the first consumer; its
        first event is ``SessionCreated``. ``session_id``: the client's name for it (the
        transport validated it); None allocates one. ``route``: the URL path it came in on (labels
        the engine's per-route metrics). Raises ``SessionError``:
        ``session_exists`` when that name is held (opening, live, or still closing),
        ``resource_exhausted`` when every slot is held, the engine's code when it refuses."""
        if self._shutting_down or self._draining:
            raise SessionError(
                errors.SHUTTING_DOWN,
                "The server is shutting down"
                if self._shutting_down
                else "This front-end is draining; connect again to reach another one",
            )
        if session_id is not None and (
            session_id in self._live or session_id in self._closing or session_id in self._opening_ids
        ):
            self.metrics.refused.labels(errors.SESSION_EXISTS).inc()
            raise SessionError(errors.SESSION_EXISTS, "A session with this id is still open or closing")
        if self.active_count() >= self.limits.max_sessions:
            self.metrics.refused.labels(errors.RESOURCE_EXHAUSTED).inc()
            raise SessionError(
                errors.RESOURCE_EXHAUSTED, f"All {self.limits.max_sessions} session slots are in use; try again later"
            )
        session_id = session_id or new_session_id(self.owner)
        try:
            self._opening_ids.add(session_id)
            return await self._open(session_id, config or SessionConfig(), projection, resumable, route)
        finally:
            self._opening_ids.discard(session_id)

    async def _open(
        self, session_id: str, config: SessionConfig, projection: Projection | None, resumable: bool, route: str
    ) -> SessionHandle:
        self._opening += 1
        self._update_gauge()
        caps = self.engine.capabilities
        vad = config.turn_detection if caps.supports_server_vad else None
        options = SessionOptions(
            prompt=SlotPrompt(text=config.instructions or None, voice=config.voice),
            server_vad=vad,
            sampling=sampling_for(config),
            route=route,
        )
        opening = self._spawn(self.engine.open_session(session_id, options), session_id)
        try:
            engine_session = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The caller gave up after admission: whatever the engine does, release it.
            self._spawn(self._roll_back_open(opening), session_id)
            raise
        except Exception as exc:
            self._opening -= 1
            self._update_gauge()
            code = exc.code if isinstance(exc, EngineError) else errors.ENGINE_ERROR
            if isinstance(exc, CapacityExhausted):
                code = errors.RESOURCE_EXHAUSTED
            elif not isinstance(exc, EngineError):
                log.exception("engine failed to open session %s", session_id)
            self.metrics.refused.labels(code).inc()
            raise SessionError(
                code, str(exc) if isinstance(exc, EngineError) else "The engine could not open a session"
            ) from None
        # From here to the runner start nothing awaits: the session appears atomically.
        self._opening -= 1
        projection = projection or RealtimeProjection()
        buffer = OutputBuffer.from_limits(self.limits, projection.render_text)
        journal = (
            ReplayJournal(
                self.clock,
                max_bytes=self.limits.resume_replay_max_bytes_per_session,
                ttl_s=self.limits.resume_replay_ttl_s,
            )
            if resumable
            else None
        )
        outlet = SessionOutlet(session_id, buffer, journal, projection, self.clock)
        lease = Lease(self.clock.monotonic())
        runner = SessionRunner(
            session_id=session_id,
            engine=engine_session,
            config=config,
            limits=self.limits,
            outlet=outlet,
            clock=self.clock,
            metrics=self.metrics,
            resumable=resumable,
            # late-bound: ``entry`` exists before the runner calls either
            on_closing=lambda _r, _stop: self._mark_closing(entry),
            on_finished=lambda _r, ok: self._on_runner_finished(entry, ok),
        )
        entry = _Entry(session_id, runner, outlet, lease)
        outlet.on_detach = lambda attachment: self.detach(session_id, attachment.generation)
        self._live[session_id] = entry
        self._update_gauge()
        self.metrics.opened.inc()
        attachment = outlet.attach(0)
        created = SessionCreated(
            session_id=session_id,
            session=runner.snapshot(),
            attachment_generation=0,
            resume_token=lease.resume_token if resumable else None,
        )
        _in_session_context(session_id, runner.start, created)
        return SessionHandle(self, runner, lease, attachment)

    async def _roll_back_open(self, opening: asyncio.Task[Any]) -> None:
        try:
            try:
                engine_session = await opening
            except Exception:  # noqa: BLE001 - an open that failed left nothing to close
                return  # nothing was opened
            try:
                await asyncio.wait_for(engine_session.close(), self.limits.engine_close_timeout_s)
            except Exception:
                log.warning("cleanup of an abandoned open failed", exc_info=True)
        finally:
            self._opening -= 1
            self._update_gauge()

    # ------------------------------------------------------------------
    # commands and control operations
    # ------------------------------------------------------------------

    def submit(self, session_id: str, command: cmd.Command) -> ErrorEvent | None:
        """Dispatch one command. Returns None when admitted, else the refusal, which is also
        queued on the session's stream unless the session is gone (``unknown_session``)."""
        entry = self._live.get(session_id)
        if entry is None:
            error = ErrorEvent(
                session_id=session_id,
                code=errors.UNKNOWN_SESSION,
                related_event_id=command.event_id,
                message="Unknown or closed session",
            )
            if self.orphan_sink is not None:
                self.orphan_sink(error)
            return error
        now = self.clock.monotonic()
        if isinstance(command, cmd.Close):
            entry.lease.touch(now)
            self._begin_stop(entry, StopKind.CLOSED, command.reason)
            return None
        if isinstance(command, cmd.EventAck):
            entry.lease.touch(now)
            if entry.outlet.journal is not None:
                entry.outlet.journal.ack(command.server_event_seq)
            return None
        runner = entry.runner
        if not runner.gate.admit(command):
            return self._refuse_input(entry, command, "Too much input is pending for this session")
        if not runner.offer(command):
            runner.gate.release(command)
            return self._refuse_input(entry, command, "Too many commands are pending for this session")
        entry.lease.touch(now)
        return None

    def _refuse_input(self, entry: _Entry, command: cmd.Command, message: str) -> ErrorEvent:
        self.metrics.input_backpressure.inc()
        error = ErrorEvent(
            session_id=entry.session_id,
            epoch=entry.runner.epoch,
            code=errors.INPUT_BACKPRESSURE,
            error_type=errors.RATE_LIMIT_ERROR,
            message=message,
            related_event_id=command.event_id,
            uses_reserve=False,
        )
        with contextlib.suppress(OutputOverflowError):  # the stream is full anyway; the caller still gets the refusal
            entry.outlet.buffer.put(error)
        return error

    def report(self, session_id: str, error: ErrorEvent) -> bool:
        """Queue an error a transport found itself (e.g. a malformed client event) on the
        session's own stream, in order with everything else; False when the session is gone
        or even the reserve is full."""
        entry = self._live.get(session_id)
        if entry is None:
            return False
        error.epoch = entry.runner.epoch
        try:
            return entry.outlet.buffer.put(error)
        except OutputOverflowError:
            return False

    def touch(self, session_id: str) -> bool:
        """A liveness signal (heartbeat) outside the mailbox; False for an unknown session."""
        entry = self._live.get(session_id)
        if entry is None:
            return False
        entry.lease.touch(self.clock.monotonic())
        return True

    def detach(self, session_id: str, generation: int) -> bool:
        """The attachment of ``generation`` lost its client. Starts the disconnect grace of a
        resumable session (a non-resumable one closes with reason ``disconnect``). Refused
        (False) when a newer attachment owns the session or the session is gone."""
        entry = self._live.get(session_id)
        if entry is None or not entry.lease.detach(generation, self.clock.monotonic()):
            return False
        current = entry.outlet.current
        if current is not None and current.generation == generation:
            entry.outlet.detach(current)
        if not entry.runner.resumable:
            self._begin_stop(entry, StopKind.CLOSED, "disconnect")
        else:
            self._bound_detached()
        return True

    def _bound_detached(self) -> None:
        """Detached sessions hold slots for clients that may never come back: keep at most
        ``max_detached_sessions``, ending the ones detached longest."""
        detached = sorted(
            (e for e in self._live.values() if e.lease.detached and e.runner.resumable),
            key=lambda e: e.lease.detached_at or 0.0,
        )
        for entry in detached[: max(len(detached) - self.limits.max_detached_sessions, 0)]:
            self._begin_stop(entry, StopKind.EXPIRED, DETACHED_LIMIT)

    def resume(
        self,
        session_id: str,
        *,
        resume_token: str | None,
        expected_generation: int | None,
        control_id: str,
        last_received_seq: int | None = None,
        projection: Projection | None = None,
    ) -> Attachment:
        """Lease compare-and-swap keyed by ``control_id`` (``expected_generation`` None: the
        one ``resume_token`` was issued with); returns the new attachment, which
        starts with ``SessionResumed`` and replays journaled events after
        ``last_received_seq`` (or says ``ResyncRequired``). A replayed ``control_id`` gets
        the same attachment again. Raises ``SessionError``."""
        entry = self._live.get(session_id)
        if entry is None or not entry.runner.resumable or entry.outlet.journal is None:
            raise unknown_session()  # a live turn-based id answers like a missing one: no existence oracle
        grant = entry.lease.resume(control_id, expected_generation, resume_token, self.clock.monotonic())
        if grant.attachment is not None:
            return grant.attachment
        replay = entry.outlet.journal.replay_after(last_received_seq)
        preamble: list[SessionEvent] = [
            SessionResumed(
                session_id=session_id,
                epoch=entry.runner.epoch,
                attachment_generation=grant.generation,
                resume_token=grant.resume_token,
                replayed=0 if isinstance(replay, str) else len(replay),
            )
        ]
        if isinstance(replay, str):
            preamble.append(ResyncRequired(session_id=session_id, epoch=entry.runner.epoch, reason=replay))
            replay = []
        grant.attachment = entry.outlet.attach(grant.generation, projection, preamble=preamble, replay=replay)
        return grant.attachment

    async def close(self, session_id: str, reason: str = "client_close") -> int | None:
        """Close and wait until the terminal event is queued. Returns the lease generation,
        or None when the session was already closing or unknown (idempotent)."""
        entry = self._live.get(session_id)
        if entry is None:
            return None
        finished = self._begin_stop(entry, StopKind.CLOSED, reason)
        await asyncio.shield(finished)
        return entry.lease.generation

    async def expire(self, session_id: str, reason: str) -> bool:
        """Expire a live session (e.g. the engine reported its resources gone)."""
        entry = self._live.get(session_id)
        if entry is None:
            return False
        await asyncio.shield(self._begin_stop(entry, StopKind.EXPIRED, reason))
        return True

    def _begin_stop(
        self, entry: _Entry, kind: StopKind, reason: str, details: dict[str, Any] | None = None
    ) -> asyncio.Future[bool]:
        self._mark_closing(entry)
        return entry.runner.request_stop(kind, reason, details)

    def _mark_closing(self, entry: _Entry) -> None:
        if entry.state is _EntryState.LIVE:
            entry.state = _EntryState.CLOSING
            self._live.pop(entry.session_id, None)
            self._closing[entry.session_id] = entry

    def _on_runner_finished(self, entry: _Entry, ok: bool) -> None:
        terminal = entry.runner.terminal
        if terminal is not None:
            self.metrics.ended.labels(terminal.kind, terminal.reason).inc()
        if ok:
            self._release(entry)
        elif entry.state is not _EntryState.RELEASED:
            entry.state = _EntryState.CLEANUP_PENDING
            self.metrics.cleanup_failures.inc()

    def _release(self, entry: _Entry) -> None:
        entry.state = _EntryState.RELEASED
        self._live.pop(entry.session_id, None)
        self._closing.pop(entry.session_id, None)
        self._update_gauge()

    # ------------------------------------------------------------------
    # reaper and shutdown
    # ------------------------------------------------------------------

    async def reap_expired(self) -> int:
        """Expire leases past idle TTL or disconnect grace and retry failed cleanups.
        Returns how many sessions were finalised (slot released) in this pass."""
        now = self.clock.monotonic()
        waits: list[asyncio.Future[bool]] = []
        for entry in list(self._live.values()):
            if not entry.runner.resumable:
                # Turn-based (OpenAI) sessions live while their socket does, up to a fixed duration.
                max_s = self.limits.max_session_duration_s
                if entry.lease.duration_expired(now, max_s):
                    waits.append(
                        asyncio.shield(
                            self._begin_stop(entry, StopKind.EXPIRED, MAX_DURATION_REACHED, {"max_duration_s": max_s})
                        )
                    )
                continue
            reason = entry.lease.expiry_reason(now, self.limits.idle_ttl_s, self.limits.disconnect_grace_s)
            if reason is not None:
                waits.append(asyncio.shield(self._begin_stop(entry, StopKind.EXPIRED, reason)))
        for entry in list(self._closing.values()):
            if entry.state is _EntryState.CLEANUP_PENDING:
                waits.append(asyncio.ensure_future(self._retry_cleanup(entry)))
        if not waits:
            return 0
        results = await asyncio.gather(*waits, return_exceptions=True)
        return sum(result is True for result in results)

    async def _retry_cleanup(self, entry: _Entry) -> bool:
        if await entry.runner.close_engine():
            self._release(entry)
            return True
        self.metrics.cleanup_failures.inc()
        return False

    async def _reaper_loop(self) -> None:
        while True:
            await self.clock.sleep(self.limits.reaper_interval_s)
            try:
                await self.reap_expired()
            except Exception:
                log.exception("session reaper pass failed")

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self) -> None:
        """Admit no new session (``server_shutting_down``); open ones go on, resumes included."""
        self._draining = True

    async def wait_idle(self) -> None:
        """Returns once no session holds a slot (at once when none does)."""
        await self._idle.wait()

    async def start(self) -> None:
        """Start the reaper (idempotent)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reaper_loop(), name="session-reaper")

    async def shutdown(self) -> None:
        """Close every session with reason ``shutdown`` (bounded by ``shutdown_timeout_s``),
        stop the reaper and every task this manager started; refuse new opens."""
        self._shutting_down = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for entry in list(self._live.values()):
            self._begin_stop(entry, StopKind.CLOSED, "shutdown")
        entries = list(self._closing.values())
        pending = [e.runner.finished for e in entries if not e.runner.finished.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.limits.shutdown_timeout_s)
        leftovers: list[asyncio.Task[Any]] = []
        for entry in entries:
            if not entry.runner.finished.done():
                # Past the deadline: stop the runner hard, but still end its stream.
                leftovers.extend(entry.runner.cancel_tasks())
                entry.outlet.buffer.close(
                    SessionClosed(session_id=entry.session_id, epoch=entry.runner.epoch, reason="shutdown")
                )
            if entry.runner.close_task is not None and not entry.runner.close_task.done():
                leftovers.append(entry.runner.close_task)
                entry.runner.close_task.cancel()
            await entry.outlet.stop()
        for task in list(self._background):
            task.cancel()
            leftovers.append(task)
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
        for entry in entries:
            self._release(entry)
        self._opening = 0
        self._update_gauge()

    # ------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, _T], session_id: str) -> asyncio.Task[_T]:
        task = _in_session_context(session_id, asyncio.get_running_loop().create_task, coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _update_gauge(self) -> None:
        active = self.active_count()
        self.metrics.slots.set(active)
        if active:
            self._idle.clear()
        else:
            self._idle.set()


def _in_session_context(session_id: str, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Call ``fn`` (which may create tasks) with the session id in the logging context."""
    context = contextvars.copy_context()
    context.run(session_id_var.set, session_id)
    return context.run(fn, *args, **kwargs)
