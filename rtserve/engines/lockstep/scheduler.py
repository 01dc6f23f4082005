"""The lockstep scheduler: one engine thread advances every slot of a ``FrameModel``
by one frame per tick (docs/engines.md#tick, docs/design.md#processes-threads-and-time).

Per tick, on the engine thread only:

1. apply deferred control ops, never during a step: *open* (``model.open_slot``, which
   recycles the row to a fresh state) and *release* (``model.release``, DRAINING -> FREE);
2. if no slot is PREFILL or LIVE: no step at all; the thread sleeps on a condition
   until a session arrives (no busy loop, no GPU burnt);
3. one ``model.prefill_step`` per PREFILL slot;
4. gather one input frame per LIVE slot from the samples that arrived for it, all slots in
   one take (``InputBacklogs.take_frames``: a partial frame is padded at its start, so the
   frame ends at the tick), silence when nothing arrived (an underrun, counted);
5. one batched ``model.step``;
6. scatter each LIVE row's output to its lease only if the lease still holds the slot
   and its epoch did not move during the step (the epoch fence);
7. PREFILL slots whose prefill finished go LIVE.

A model that takes no audio (text-to-speech: ``audio_input=False``) skips step 4: its rows
get whatever the session sent through ``between_steps``, a control operation that runs a
call on the engine thread between two steps, fenced like the others (skipped once the lease
no longer holds the slot). Such a model may step only the rows that have input and return
``None`` for the rest (docs/engines.md#kyutai-tts-on-the-lockstep-runtime).

A model whose output may be made ahead of playback (text-to-speech: ``run_ahead``,
a ``RunsAhead`` model) is stepped without waiting for the tick once a live row that may step
(``ready_rows``) has ``run_ahead_refill_frames`` of room in its output queue (every row with
any room steps along), and between ticks the thread wakes for a session's new input instead of
sleeping out the period; a row whose queue is full is not stepped (it waits for its reader
instead of losing audio). With no such row it falls back to pacing, and each tick steps every
row with room. Other models are paced as below (docs/engines.md#running-ahead-of-playback).

Ticks are paced by ``TickPacer`` on a drift-free grid (tick n due at start + n *
period). After an overrun the missed ticks run back to back, because clients kept
sending a frame per period meanwhile: each catch-up tick consumes one of those frames,
so an overrun is measured and logged but never turns into lasting input latency. The
pacer never chases more deadlines than the input backlog holds frames
(``max_input_backlog_ms``: the backlog bound dropped older input anyway); deadlines beyond
that are skipped and counted.
A model that never drops input (speech-to-text: ``drains``, a ``DrainsInput`` model) keeps
whatever stands in a backlog after a take: a burst from the client or the network would
otherwise add a frame of latency to that stream for good. After a paced tick, while the time
left before the next deadline holds another step with room to spare, such a model takes one
more frame from each live slot whose input stood through the tick's take (as many as stood)
and steps only those rows, the others held as they were (a *drain step*;
docs/engines.md#draining-waiting-input). Prefilling slots step in drain steps too (a
``prefill_step`` each, on silence), so a prefill is done in the spare time of its first ticks
rather than one frame a tick while the client's audio waits behind it. A live slot with no
input at a tick is held rather than stepped on silence for a few ticks (``late_input_grace_ticks``):
its late frame gets a drain step when it comes (``draining.DrainLedger``). A model that steps a
few rows in a batch of their own (``DrainsInput.burst_rows``) gets their drain steps in bursts:
several frames in one call (docs/engines.md#drain-bursts).

Overruns (ticks longer than the period), catch-up ticks, skipped deadlines and tick
lateness are metrics; overruns and skips also log a rate-limited warning. Admission
(``acquire``) answers at once: a lease, or ``CapacityExhausted``.

The event loop never blocks on the engine thread: input goes through a lock-protected
table of per-slot sample backlogs (``InputBacklogs``, drop-oldest), output through a bounded per-slot
``OutputHandoff`` (drop-oldest audio, text kept) plus one coalesced
``call_soon_threadsafe`` wake-up per loop per tick.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry

from rtserve.codecs.pcm import FloatArray
from rtserve.config import LockstepConfig
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.lockstep.burst_cost import BurstCost
from rtserve.engines.lockstep.draining import DrainLedger
from rtserve.engines.lockstep.lease import SlotLease
from rtserve.engines.lockstep.log_throttle import LogThrottle
from rtserve.engines.lockstep.metrics import LockstepMetrics
from rtserve.engines.lockstep.pacing import SystemTickClock, TickClock, TickOutcome, TickPacer
from rtserve.engines.lockstep.slots import InputBacklogs, LoopNotifier, SlotPhase
from rtserve.engines.protocols import FrameModel
from rtserve.engines.values import FrameOutput, SlotPrompt
from rtserve.errors import ENGINE_ERROR, ENGINE_UNAVAILABLE

log = logging.getLogger(__name__)

# Overrun warnings are rate-limited: a saturated engine would otherwise log 12 lines a second.
_OVERRUN_LOG_INTERVAL_S = 5.0


@dataclass(frozen=True)
class TickReport:
    """Timing of one stepped tick, handed to the ``on_tick`` observer (benchmarks, tests)."""

    index: int  # deadline number since the schedule last (re)started
    deadline: float
    started: float
    step_s: float  # the batched model step alone
    duration_s: float  # the whole tick: control ops, gather, step, scatter
    live: int
    prefill: int
    overrun_s: float  # how much longer than one period the tick took; 0 within budget
    catch_up: bool  # ran back to back after the previous tick because its deadline had passed
    behind: int  # deadlines already passed when it ended, to be caught up back to back
    skipped: int  # deadlines given up when it ended (more than the input backlog's frames behind)
    ahead: bool = False  # run ahead of the schedule (``run_ahead``): not paced, so not late or behind

    @property
    def lateness_s(self) -> float:
        return self.started - self.deadline


class RunsAhead(Protocol):
    """A model whose rows may step ahead of playback, when they have what they need."""

    def ready_rows(self) -> npt.NDArray[np.bool_]:
        """Which rows would step now (``[batch_size]``); engine thread only."""
        ...


class DrainsInput(Protocol):
    """A model that can step some rows while the others keep their state."""

    # A drain of this many live rows or fewer (none prefilling) may step several frames in one
    # ``step_rows_burst`` call; 0: every drain step is one ``step_rows``.
    burst_rows: int

    def step_rows(self, frames: FloatArray, stepped: npt.NDArray[np.bool_]) -> Sequence[FrameOutput | None]:
        """Advance only the ``stepped`` rows (``[batch_size]`` bool) on their ``frames`` (silence for
        a prefilling row, whose ``prefill_step`` was called first); the other rows keep their
        state. Outputs for the stepped rows (None elsewhere)."""
        ...

    def step_rows_burst(
        self, frames: FloatArray, slots: npt.NDArray[np.intp]
    ) -> Sequence[Sequence[FrameOutput | None]]:
        """Advance the rows ``slots`` (at most ``burst_rows``) over ``frames`` (``[K, len(slots),
        frame_size]``), K steps back to back, the other rows keeping their state: each step's
        outputs as ``step_rows`` gives them."""
        ...


@dataclass
class _Slot:
    index: int
    phase: SlotPhase = SlotPhase.FREE
    lease: SlotLease | None = None
    opened: bool = False  # open_slot was applied for the current lease
    generation: int = 0  # bumped by every acquire and release: stale control ops are skipped


class _OpKind(enum.Enum):
    OPEN = enum.auto()
    RELEASE = enum.auto()
    CALL = enum.auto()  # between_steps: a session's input applied on the engine thread


@dataclass(frozen=True)
class _ControlOp:
    kind: _OpKind
    slot: int
    generation: int
    lease: SlotLease
    prompt: SlotPrompt | None = None
    call: Callable[[], None] | None = None


class _LiveRow(NamedTuple):  # a tuple: built once per live slot per tick, so kept cheap
    slot: int
    lease: SlotLease
    epoch: int
    consumed: int  # input samples this tick took (stepped or trimmed)


@dataclass(frozen=True)
class _TickWork:
    step_s: float
    duration_s: float
    live: int
    prefill: int
    control_s: float  # the parts around the step, for the overrun log
    gather_s: float
    scatter_s: float


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LockstepScheduler:
    def __init__(
        self,
        model: FrameModel,
        config: LockstepConfig,
        registry: CollectorRegistry,
        *,
        name: str = "lockstep",
        clock: TickClock | None = None,
        on_tick: Callable[[TickReport], None] | None = None,
        audio_input: bool = True,
        run_ahead: RunsAhead | None = None,
        drains: DrainsInput | None = None,
        drain_after_ticks: int = 1,
        late_input_grace_ticks: int = 0,
        flush_between_ticks: bool = False,
        drain_room: float = 1.5,
    ) -> None:
        """``audio_input`` False: the model takes no audio frames (its input comes through
        ``between_steps``); no backlog is read and no underrun counted. ``run_ahead``: the
        model (taking no audio) whose ready rows step as fast as their readers take output.
        ``drains``: the model (taking audio) whose rows with waiting input get drain steps, once
        their input stood through ``drain_after_ticks`` takes in a row; its live rows with no
        input are held rather than stepped on silence for up to ``late_input_grace_ticks`` ticks
        (``DrainLedger``). ``flush_between_ticks``: frames a stream asks to be stepped now
        (``drain_soon``) get their drain steps as soon as it asks, between ticks, rather than after
        the next tick. ``drain_room``: a drain step (or burst) runs only where this many times
        its expected duration fits before the next deadline."""
        if run_ahead is not None and audio_input:
            raise ValueError("only a model without audio input can run ahead of its ticks")
        if drains is not None and not audio_input:
            raise ValueError("only a model with audio input has input to drain")
        self.model = model
        self.audio_input = audio_input
        self.run_ahead = run_ahead
        self.drains = drains
        self._ledger = (
            DrainLedger(model.batch_size, drain_after_ticks, late_input_grace_ticks) if drains is not None else None
        )
        self._drain_timing: tuple[int, float] | None = None  # the last drain step's rows and duration
        self._burst_cost = BurstCost()
        self._flush_between_ticks = flush_between_ticks and drains is not None
        self._last_tick_s = 0.0  # the last paced tick's duration: a drain step's room between ticks
        self._drain_room = drain_room
        self.name = name
        self.batch_size = model.batch_size
        self.frame_size = model.frame_size
        self.sample_rate = model.sample_rate
        # Drains wait for the output that answers the last input too (``FrameModel.output_delay_frames``).
        self.output_delay_frames = model.output_delay_frames
        self.period_s = model.frame_size / model.sample_rate
        # Every slot's input bound (at least a frame); the pacer catches up at most its whole frames.
        self.input_backlog_samples = max(
            model.frame_size, round(config.max_input_backlog_ms * model.sample_rate / 1000)
        )
        self.catch_up_frames = self.input_backlog_samples // model.frame_size
        rate = model.sample_rate
        self.inputs = InputBacklogs(
            self.batch_size,
            model.frame_size,
            self.input_backlog_samples,
            config.latency_trim_window_frames,
            round(config.jitter_cushion_ms * rate / 1000),
            max(1, round(config.drift_trim_ms * rate / 1000)),
            round(config.underrun_repay_ms * rate / 1000),
            config.late_cushion_window_frames,
            config.late_cushion_release_frames,
        )
        self.metrics = LockstepMetrics(registry, self.period_s, self.batch_size)
        self._config = config
        self._refill_frames = min(config.run_ahead_refill_frames, config.output_queue_frames)
        self._clock = clock or SystemTickClock()
        self._on_tick = on_tick
        self._slots = [_Slot(i) for i in range(self.batch_size)]
        self._ops: deque[_ControlOp] = deque()
        self._cond = threading.Condition()  # guards the slot table, the op queue and the flags below
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = False
        self._idle = True
        self._drain_asked = False  # a stream asked for drain steps now (flush_between_ticks)
        self.failed = False
        self._notifier = LoopNotifier()
        self._frames = np.zeros((self.batch_size, self.frame_size), np.float32)
        self._live_mask = np.zeros(self.batch_size, bool)
        self._dirty_rows = np.zeros(self.batch_size, bool)  # rows not silent since the last tick
        self._held = np.zeros(self.batch_size, bool)  # live rows this tick holds for their late input
        self._overrun_log = LogThrottle(_OVERRUN_LOG_INTERVAL_S)
        self._last_tick_due: float | None = None

    # ------------------------------------------------------------------ loop side

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def is_idle(self) -> bool:
        """True while the engine thread sleeps for lack of PREFILL/LIVE slots."""
        return self._idle

    def last_tick_due(self) -> float | None:
        """When the latest tick was due on the drift-free schedule (``time.monotonic()`` time;
        an unpaced ``tick()``: when it ran); None before the first. Front ends time their uplink
        by it: a tick that started late must not shift the grid they aim at."""
        return self._last_tick_due

    def phase_of(self, lease: SlotLease) -> SlotPhase:
        slot = self._slots[lease.slot]
        return slot.phase if slot.lease is lease else SlotPhase.FREE if lease.released else SlotPhase.DRAINING

    def acquire(self, prompt: SlotPrompt = SlotPrompt(), *, session_id: str = "-") -> SlotLease:
        """A lease on a free slot, or ``CapacityExhausted`` at once. Never waits for a tick."""
        with self._cond:
            if self._stopping or self._stopped or self.failed:
                raise EngineError("the engine is not running", code=ENGINE_UNAVAILABLE)
            slot = next((s for s in self._slots if s.phase is SlotPhase.FREE), None)
            if slot is None:
                raise CapacityExhausted(f"all {self.batch_size} engine slots are in use")
            lease = SlotLease(self, slot.index, session_id, _running_loop(), self._config)
            slot.generation += 1
            slot.lease, slot.phase, slot.opened = lease, SlotPhase.PREFILL, False
            self._ops.append(_ControlOp(_OpKind.OPEN, slot.index, slot.generation, lease, prompt))
            self._update_occupancy_locked()
            self._cond.notify()
        log.debug("%s slot %d acquired", self.name, lease.slot, extra={"session_id": session_id})
        return lease

    def release(self, lease: SlotLease) -> None:
        """DRAINING now (no more output); the engine thread frees the slot between steps."""
        with self._cond:
            slot = self._slots[lease.slot]
            if slot.lease is not lease:
                return  # already released (or cleaned up by stop)
            slot.generation += 1
            slot.lease, slot.phase, slot.opened = None, SlotPhase.DRAINING, False
            self._ops.append(_ControlOp(_OpKind.RELEASE, slot.index, slot.generation, lease))
            self._cond.notify()
        lease.output.close()
        if lease.loop is not None:
            self._notifier.notify([(lease.loop, lease)])

    def between_steps(self, lease: SlotLease, call: Callable[[], None]) -> None:
        """Run ``call`` on the engine thread between two steps, in order with this lease's other
        control operations, unless the lease no longer holds its slot by then. A call that raises
        ``EngineError`` ends the lease with that error; any other exception fails it."""
        with self._cond:
            slot = self._slots[lease.slot]
            if slot.lease is not lease:
                return
            self._ops.append(_ControlOp(_OpKind.CALL, slot.index, slot.generation, lease, call=call))
            self._cond.notify()

    def drain_soon(self, lease: SlotLease, frames: int) -> None:
        """Let drain steps take the last ``frames`` whole frames ``lease`` queued (and the input
        before them) as soon as the ticks leave room, instead of one a tick: a stream flushing
        its model's delay. Without drain steps, nothing changes: they go a tick each."""
        ledger = self._ledger
        if ledger is None or frames <= 0:
            return
        slot = lease.slot
        self.between_steps(lease, lambda: ledger.flush(slot, frames))
        if self._flush_between_ticks:
            with self._cond:
                self._drain_asked = True
                self._cond.notify()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("scheduler already started")
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None, failure: EngineFailure | None = None) -> None:
        """Stop the thread, then fail every remaining lease (with ``failure``: why the engine
        stopped, ``engine_unavailable`` unless told). Blocking: call off the loop."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error(
                    "%s engine thread did not stop within %.1fs; leaving its slots alone", self.name, timeout_s or 0.0
                )
                return
        # The thread is gone (or never ran): this caller owns the model now.
        self._shut_down(failure or EngineFailure(ENGINE_UNAVAILABLE, "the engine stopped"))

    # ------------------------------------------------------------------ engine thread

    def tick(self) -> bool:
        """Run one tick now, without pacing; False when nothing was stepped.

        The thread's body. Call it directly only on a scheduler that was not started
        (deterministic tests, benchmarks of the step path).
        """
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("the engine thread owns the model while the scheduler runs")
        return self._run_tick() is not None

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a scheduler bug: fail every session rather than hang them
            log.exception("%s engine thread crashed", self.name)
            with self._cond:
                self.failed = True
            self._shut_down(EngineFailure(ENGINE_ERROR, "the engine failed"))

    def _loop(self) -> None:
        pacer = TickPacer(self._clock, self.period_s, self.catch_up_frames)
        scheduled = False
        while True:
            with self._cond:
                while not self._stopping and not self._has_work_locked():
                    self._idle = True
                    self._cond.wait()
                self._idle = False
                if self._stopping:
                    return
            if not scheduled:
                pacer.restart()
                scheduled = True
            if self.run_ahead is not None:
                if self._may_run_ahead():
                    started = self._clock.monotonic()
                    work = self._run_tick(None)
                    scheduled = work is not None
                    if work is not None:
                        pacer.restart(self.period_s)  # a paced tick, if one comes next, is a period later
                        self._report(
                            TickOutcome(pacer.index, started, started, work.duration_s, 0.0, False, 0, 0),
                            work,
                            ahead=True,
                        )
                    continue
                if self._wait_for_input(pacer.deadline()):
                    continue
            if self._flush_between_ticks and self._last_tick_s:
                self._drain_when_asked(pacer.deadline())
            due = pacer.wait()
            work = self._run_tick(due)
            if work is None:
                scheduled = False  # idle again: the next session starts a fresh schedule
                continue
            outcome = pacer.finish()
            self._record_timing(outcome, work)
            self._report(outcome, work)
            if self.drains is not None:
                self._last_tick_s = work.duration_s
                self._drain(pacer.deadline(), work.duration_s)

    def _report(self, outcome: TickOutcome, work: _TickWork, *, ahead: bool = False) -> None:
        if self._on_tick is not None:
            self._on_tick(
                TickReport(
                    outcome.index,
                    outcome.deadline,
                    outcome.started,
                    work.step_s,
                    work.duration_s,
                    work.live,
                    work.prefill,
                    outcome.overrun_s,
                    outcome.catch_up,
                    outcome.behind,
                    outcome.skipped,
                    ahead,
                )
            )

    def _may_run_ahead(self) -> bool:
        """A live row would step now and its reader has ``run_ahead_refill_frames`` of room
        (engine thread)."""
        assert self.run_ahead is not None
        self._apply_control_ops()  # a session's new text may be what makes its row ready
        ready = self.run_ahead.ready_rows()
        with self._cond:
            leases = [(s.index, s.lease) for s in self._slots if s.phase is SlotPhase.LIVE and s.lease is not None]
        # A row whose reader takes frames at playback speed gains one frame of room per period,
        # and a step costs the whole batch: stepping for each frame taken ran back to back at
        # hundreds of streams, each step for the few read since (benchmarks/notes/voice_agent_gpu.md).
        return any(ready[index] and lease.output.room >= self._refill_frames for index, lease in leases)

    def _wait_for_input(self, due: float) -> bool:
        """Until the tick is due or a session's control operation arrives; True for the latter
        (its input may let a row run ahead). One wait on the clock's seconds: a test clock that
        does not move with real time just ticks at its deadline."""
        with self._cond:
            if not self._ops and not self._stopping:
                self._cond.wait(max(0.0, due - self._clock.monotonic()))
            return bool(self._ops) or self._stopping

    def _has_work_locked(self) -> bool:
        return bool(self._ops) or any(s.phase in (SlotPhase.PREFILL, SlotPhase.LIVE) for s in self._slots)

    def _record_timing(self, outcome: TickOutcome, work: _TickWork) -> None:
        metrics = self.metrics
        metrics.tick_lateness_seconds.observe(max(0.0, outcome.lateness_s))
        if outcome.catch_up:
            metrics.catch_up_ticks.inc()
        if outcome.overrun_s > 0:
            metrics.overruns.inc()
        if outcome.skipped:
            metrics.skipped_deadlines.inc(outcome.skipped)
        if outcome.overrun_s > 0 or outcome.skipped:
            self._note_overrun(outcome, work)

    def _note_overrun(self, outcome: TickOutcome, work: _TickWork) -> None:
        overruns = self._overrun_log.due(1, self._clock.monotonic())
        if overruns is None:
            return
        log.warning(
            "%s tick overran: took %.1f ms of a %.1f ms budget (control %.1f, gather %.1f, step %.1f, "
            "scatter %.1f), started %.1f ms late; %d deadline(s) behind, caught up back to back; %d "
            "skipped (more than %d behind) (%d overrun(s) since the last report)",
            self.name,
            outcome.duration_s * 1e3,
            self.period_s * 1e3,
            work.control_s * 1e3,
            work.gather_s * 1e3,
            work.step_s * 1e3,
            work.scatter_s * 1e3,
            outcome.lateness_s * 1e3,
            outcome.behind,
            outcome.skipped,
            self.catch_up_frames,
            overruns,
        )

    def _run_tick(self, due: float | None = None) -> _TickWork | None:
        clock = self._clock
        tick_started = clock.monotonic()
        self._apply_control_ops()
        live, prefill = self._stepping_slots()
        self.metrics.live_slots.set(len(live))
        if not live and not prefill:
            return None

        finished_prefill = self._prefill_steps(prefill)

        gather_started = clock.monotonic()
        late_s = 0.0 if due is None else max(0.0, gather_started - due)  # on the tick clock, maybe a test's
        self._last_tick_due = time.monotonic() - late_s
        rows = self._gather(live)
        step_started = clock.monotonic()
        try:
            if self.drains is not None and self._held.any():  # some live rows wait for late input
                outputs = self.drains.step_rows(self._frames, self._stepped(prefill))
            else:
                outputs = self.model.step(self._frames, self._live_mask)
            if len(outputs) != self.batch_size:
                raise EngineError(f"step returned {len(outputs)} outputs for {self.batch_size} slots")
        except Exception:  # noqa: BLE001 - the stepped slots fail; the engine thread goes on
            self._fail([row.lease for row in rows] + [lease for _, lease in prefill], "step")
            outputs = None
        scatter_started = clock.monotonic()
        step_s = scatter_started - step_started
        wake = self._scatter(rows, outputs) if outputs is not None else []
        scatter_s = clock.monotonic() - scatter_started

        self._go_live(finished_prefill, wake)
        duration_s = clock.monotonic() - tick_started
        control_s, gather_s = gather_started - tick_started, step_started - gather_started
        metrics = self.metrics
        metrics.step_seconds.observe(step_s)
        metrics.tick_seconds.observe(duration_s)
        metrics.control_seconds.observe(control_s)
        metrics.gather_seconds.observe(gather_s)
        metrics.scatter_seconds.observe(scatter_s)
        # Last: the woken loop competes for the GIL, so let it in only once the tick is done.
        self._notifier.notify(wake)
        return _TickWork(step_s, duration_s, len(live), len(prefill), control_s, gather_s, scatter_s)

    def _stepping_slots(self) -> tuple[list[tuple[int, SlotLease]], list[tuple[int, SlotLease]]]:
        """The LIVE slots and the opened PREFILL slots, with their leases."""
        with self._cond:
            live = [(s.index, s.lease) for s in self._slots if s.phase is SlotPhase.LIVE and s.lease is not None]
            prefill = [
                (s.index, s.lease)
                for s in self._slots
                if s.phase is SlotPhase.PREFILL and s.opened and s.lease is not None
            ]
        return live, prefill

    def _prefill_steps(self, prefill: list[tuple[int, SlotLease]]) -> list[tuple[int, SlotLease]]:
        """One ``prefill_step`` per prefilling slot; the slots whose prefill it finished."""
        finished: list[tuple[int, SlotLease]] = []
        for index, lease in prefill:
            try:
                if self.model.prefill_step(index):
                    finished.append((index, lease))
            except Exception:  # noqa: BLE001 - the slot fails; the tick goes on
                self._fail([lease], "prefill_step")
        return finished

    def _go_live(
        self, finished: list[tuple[int, SlotLease]], wake: list[tuple[asyncio.AbstractEventLoop, SlotLease]]
    ) -> None:
        """After the step: slots whose prefill finished go LIVE (their waiters join ``wake``)."""
        with self._cond:
            for index, lease in finished:
                slot = self._slots[index]
                if slot.lease is lease and slot.phase is SlotPhase.PREFILL:
                    slot.phase = SlotPhase.LIVE
                    if lease.loop is not None:
                        wake.append((lease.loop, lease))

    def _drain(self, deadline: float, tick_s: float) -> None:
        """Drain steps until the next deadline leaves too little room, or no slot the ledger names
        has a whole frame (a frame that arrived since the tick's take is on time for the next
        tick: taking it now would leave that tick without one) and none is prefilling (its
        client's audio waits until the prefill is done).

        The room is counted in drain steps: the last one's duration if it stepped as many rows or
        more, else the tick's. A model that steps a few rows in a batch of their own (Kyutai STT's
        flush rows) fits several in the time of one tick."""
        ledger = self._ledger
        assert self.drains is not None and ledger is not None
        clock = self._clock
        while True:
            live, prefill = self._stepping_slots()
            waiting = [
                (index, lease) for index, lease in live if ledger.wants(index) and len(lease.input) >= self.frame_size
            ]
            if not waiting:
                ledger.settle()
                if not prefill:
                    return
            burst = self._burst_of(waiting, prefill)
            if burst:
                if not self._drain_burst(burst, deadline, tick_s):
                    return
                continue
            stepping = len(waiting) + len(prefill)
            last = self._drain_timing
            drain_s = last[1] if last is not None and stepping <= last[0] else tick_s
            if deadline - clock.monotonic() <= self._drain_room * drain_s:
                return
            started = clock.monotonic()
            for index, _ in waiting:
                ledger.spend(index)
            self._live_mask[:] = False
            rows = self._take_input(waiting, drain=True)
            finished = self._prefill_steps(prefill)
            try:
                outputs = self.drains.step_rows(self._frames, self._stepped(prefill))
            except Exception:  # noqa: BLE001 - the stepped slots fail; the engine thread goes on
                self._fail([row.lease for row in rows] + [lease for _, lease in prefill], "step_rows")
                return
            wake = self._scatter(rows, outputs)
            self._go_live(finished, wake)
            self._notifier.notify(wake)
            duration_s = clock.monotonic() - started
            self.metrics.drain_steps.inc()
            self.metrics.drain_step_seconds.observe(duration_s)
            self.metrics.drained_input_frames.inc(len(rows))
            self._drain_timing = (stepping, duration_s)

    def _burst_of(
        self, waiting: list[tuple[int, SlotLease]], prefill: list[tuple[int, SlotLease]]
    ) -> list[tuple[int, SlotLease]]:
        """The rows the next drain steps in a burst: those flushing (a turn's end, which someone
        waits for) alone when they fit one and a row beside them has fewer frames to give (a burst
        steps as many frames as its shortest row: a late frame beside a flush would cut the flush's
        burst to one frame); else every waiting one if they fit one, else those flushing if they
        do; none while a slot prefills (its steps go one a call) or with no burst rows."""
        limit = self.drains.burst_rows if self.drains is not None else 0
        if prefill or not limit:
            return []
        assert self._ledger is not None
        flushing = [(index, lease) for index, lease in waiting if self._ledger.flushing(index)]
        if flushing and len(flushing) <= limit and self._burst_frames(waiting) < self._burst_frames(flushing):
            return flushing
        if len(waiting) <= limit:
            return waiting
        return flushing if len(flushing) <= limit else []

    def _burst_frames(self, rows: list[tuple[int, SlotLease]]) -> int:
        """The frames a burst of ``rows`` may step: as many as every one of them may give (what the
        ledger lets it take and what stands)."""
        ledger = self._ledger
        assert ledger is not None
        return min(min(ledger.wanted(i), len(lease.input) // self.frame_size) for i, lease in rows)

    def _drain_burst(self, waiting: list[tuple[int, SlotLease]], deadline: float, tick_s: float) -> bool:
        """The drain steps of a few rows in one model call (``DrainsInput.step_rows_burst``): as many
        frames as every one of them may give, and as fit before the deadline at the bursts' fitted
        cost (``BurstCost``; the tick's a frame before the first). False when not one fits."""
        ledger, drains, clock = self._ledger, self.drains, self._clock
        assert ledger is not None and drains is not None
        room_s = deadline - clock.monotonic()
        if room_s <= 0:
            return False
        frames = min(self._burst_frames(waiting), self._burst_cost.frames_within(room_s, self._drain_room, tick_s))
        if frames < 1:
            return False
        started = clock.monotonic()
        slots = np.fromiter((index for index, _ in waiting), np.intp, len(waiting))
        burst = np.empty((frames, slots.size, self.frame_size), np.float32)
        takes: list[list[_LiveRow]] = []
        for k in range(frames):
            for index in slots.tolist():
                ledger.spend(index)
            takes.append(self._take_input(waiting, drain=True))
            burst[k] = self._frames[slots]
        try:
            outputs = drains.step_rows_burst(burst, slots)
        except Exception:  # noqa: BLE001 - the stepped slots fail; the engine thread goes on
            self._fail([lease for _, lease in waiting], "step_rows_burst")
            return False
        wake = [woken for rows, step in zip(takes, outputs, strict=True) for woken in self._scatter(rows, step)]
        self._notifier.notify(wake)
        duration_s = clock.monotonic() - started
        self._burst_cost.observe(frames, duration_s)
        self.metrics.drain_burst_frames.observe(frames)
        self.metrics.drain_steps.inc(frames)
        for _ in range(frames):
            self.metrics.drain_step_seconds.observe(duration_s / frames)
        self.metrics.drained_input_frames.inc(frames * slots.size)
        return True

    def _drain_when_asked(self, due: float) -> None:
        """Until the tick is ``due``: drain steps whenever a stream asks for its frames to be
        stepped now (``drain_soon``: a turn's end flushing the model's delay), its request applied
        with the other control operations first, so the flush starts when it comes, not after the
        next tick (half a period later on average, plus that tick)."""
        while True:
            with self._cond:
                while not self._drain_asked and not self._stopping:
                    if not self._cond.wait(max(0.0, due - self._clock.monotonic())):
                        return  # the tick is due
                if self._stopping:
                    return
                self._drain_asked = False
            self._apply_control_ops()
            self._drain(due, self._last_tick_s)

    def _stepped(self, prefill: list[tuple[int, SlotLease]]) -> npt.NDArray[np.bool_]:
        """The rows a step of only some rows advances: the live rows given a frame, and the
        prefilling rows on silence (as a tick steps them)."""
        stepped = self._live_mask.copy()
        silent = np.fromiter((index for index, _ in prefill), np.intp, len(prefill))
        self._frames[silent] = 0.0
        self._dirty_rows[silent] = False
        stepped[silent] = True
        return stepped

    def _apply_control_ops(self) -> None:
        with self._cond:
            ops = list(self._ops)
            self._ops.clear()
        for op in ops:
            if op.kind is _OpKind.OPEN:
                self._apply_open(op)
            elif op.kind is _OpKind.CALL:
                self._apply_call(op)
            else:
                self._apply_release(op)

    def _apply_call(self, op: _ControlOp) -> None:
        slot = self._slots[op.slot]
        if slot.generation != op.generation or not slot.opened or op.call is None:
            return  # released (or refused at open) since
        try:
            op.call()
        except EngineError as exc:  # a typed refusal of this session's input: the model is fine
            op.lease.output.close(EngineFailure(exc.code, str(exc)))
            self.release(op.lease)
        except Exception:  # noqa: BLE001 - the slot fails; the engine thread goes on
            self._fail([op.lease], "between_steps call")

    def _apply_open(self, op: _ControlOp) -> None:
        slot = self._slots[op.slot]
        if slot.generation != op.generation:
            return  # released before it was ever opened
        try:
            prefill_steps = self.model.open_slot(op.slot, op.prompt or SlotPrompt())
        except EngineError as exc:  # a typed refusal (no KV memory, bad prompt): the model is fine
            log.warning("%s refused slot %d: %s", self.name, op.slot, exc, extra={"session_id": op.lease.session_id})
            op.lease.output.close(EngineFailure(exc.code, str(exc)))
            self.release(op.lease)
            return
        except Exception:  # noqa: BLE001 - the slot fails to open; the engine thread goes on
            self._fail([op.lease], "open_slot")
            return
        with self._cond:
            if slot.generation == op.generation:
                slot.opened = True
                slot.phase = SlotPhase.PREFILL if prefill_steps > 0 else SlotPhase.LIVE
        if op.lease.loop is not None:  # wait_live() may be waiting on this
            self._notifier.notify([(op.lease.loop, op.lease)])

    def _apply_release(self, op: _ControlOp) -> None:
        try:
            self.model.release(op.slot)
        except Exception:  # the row is reset by open_slot before reuse anyway
            log.exception("%s release(%d) failed", self.name, op.slot, extra={"session_id": op.lease.session_id})
        with self._cond:
            slot = self._slots[op.slot]
            if slot.generation == op.generation:
                slot.phase = SlotPhase.FREE
            self._update_occupancy_locked()
        op.lease.released = True
        if op.lease.loop is not None:
            self._notifier.notify([(op.lease.loop, op.lease)])

    def _gather(self, live: list[tuple[int, SlotLease]]) -> list[_LiveRow]:
        frames, mask, dirty = self._frames, self._live_mask, self._dirty_rows
        mask[:] = False
        if self.audio_input:
            rows = self._take_input(live)
        else:
            rows = []
            for index, lease in live:
                # Running ahead, a row whose reader is a full queue behind waits instead of losing audio.
                mask[index] = self.run_ahead is None or lease.output.has_room
                rows.append(_LiveRow(index, lease, lease.epoch, 0))
        stale = dirty & ~mask  # rows that carried audio last tick but are not live now
        if stale.any():
            frames[stale] = 0.0
            dirty[stale] = False
        return rows

    def _take_input(self, live: list[tuple[int, SlotLease]], *, drain: bool = False) -> list[_LiveRow]:
        """Every live slot's frame in one take (``InputBacklogs.take_frames``); silence where
        nothing arrived (an underrun, counted). ``drain``: a drain step's take, whose rows all
        had a frame waiting (what stands after it was counted by the tick's take)."""
        frames, dirty = self._frames, self._dirty_rows
        slots = np.fromiter((index for index, _ in live), np.intp, len(live))
        self._live_mask[slots] = True
        arrived = [lease.pushed_at for _, lease in live]  # read first: what the take finds arrived by then
        taken, trimmed, standing, missing = self.inputs.take_frames(slots, frames)
        held = np.zeros(len(live), bool)
        if not drain:
            waited = int(standing.sum())
            if waited:
                self.metrics.standing_input_frames.inc(waited)
            if self._ledger is not None:
                held = self._ledger.after_take(slots, taken, standing)
                self._held[:] = False
                self._held[slots[held]] = True
                self._live_mask[slots[held]] = False
        underrun = (taken == 0) & ~held
        silent = slots[underrun]
        frames[silent[dirty[silent]]] = 0.0
        dirty[slots] = ~underrun  # rows not silent since the last tick
        rows: list[_LiveRow] = []
        for (index, lease), at, got, cut, wait in zip(
            live, arrived, taken.tolist(), trimmed.tolist(), held.tolist(), strict=True
        ):
            if wait:  # held: not stepped this tick, its late frame is owed a drain step
                continue
            if got:
                lease.wake_order = at
            else:
                lease.underruns += 1
            if cut:
                lease.samples_trimmed += cut
            rows.append(_LiveRow(index, lease, lease.epoch, got + cut))
        underruns, trimmed_total = int(underrun.sum()), int(trimmed.sum())
        if underruns:
            self.metrics.underruns.inc(underruns)
        silence = int(missing[~held].sum())
        if silence:
            self.metrics.silence_stepped_seconds.inc(silence / self.sample_rate)
        if trimmed_total:
            self.metrics.trimmed_input_samples.inc(trimmed_total)
        return rows

    def _scatter(
        self, rows: list[_LiveRow], outputs: Sequence[FrameOutput | None]
    ) -> list[tuple[asyncio.AbstractEventLoop, SlotLease]]:
        """Hand each row's frame to its lease; return the leases whose loop must be woken."""
        wake: list[tuple[asyncio.AbstractEventLoop, SlotLease]] = []
        dropped = 0
        slots = self._slots
        for row in rows:
            lease = row.lease
            lease.ticks_stepped += 1
            if row.consumed:
                lease.last_input_tick = lease.ticks_stepped  # before the count wait_drained() reads first
                lease.samples_consumed += row.consumed
            output = outputs[row.slot]
            # The epoch fence: a release or set_epoch during the step voids this frame.
            if output is not None and slots[row.slot].lease is lease and lease.epoch == row.epoch:
                output = output.with_input_samples(lease.samples_consumed + lease.samples_discarded)
                if lease.output.put(output, row.epoch):
                    lease.dropped_output_frames += 1
                    dropped += 1
            if lease.loop is not None:
                wake.append((lease.loop, lease))
        if dropped:
            self.metrics.dropped_output_frames.inc(dropped)
        return wake

    def _fail(self, leases: list[SlotLease], call: str) -> None:
        """A model call raised: fail the sessions involved, keep serving the others."""
        # Called from the except blocks around each model call, so the traceback is the failure's.
        log.exception("%s model %s failed; failing %d session(s)", self.name, call, len(leases))  # noqa: LOG004
        self.metrics.engine_failures.inc()
        failure = EngineFailure(ENGINE_ERROR, "the engine failed while serving this session")
        for lease in leases:
            lease.output.close(failure)
            self.release(lease)

    def _shut_down(self, failure: EngineFailure) -> None:
        with self._cond:
            self._stopped = True
            held = [s.index for s in self._slots if s.phase is not SlotPhase.FREE]
            leases = [s.lease for s in self._slots if s.lease is not None]
            leases += [op.lease for op in self._ops if op.kind is _OpKind.RELEASE]  # DRAINING slots
            self._ops.clear()
            for slot in self._slots:
                slot.generation += 1
                slot.lease, slot.phase, slot.opened = None, SlotPhase.FREE, False
            self._update_occupancy_locked()
        for index in held:
            try:
                self.model.release(index)
            except Exception:
                log.exception("%s release(%d) failed at shutdown", self.name, index)
        for lease in leases:
            lease.output.close(failure)
            lease.released = True
            if lease.loop is not None:
                self._notifier.notify([(lease.loop, lease)])
        self.metrics.live_slots.set(0)

    def _update_occupancy_locked(self) -> None:
        self.metrics.occupied_slots.set(sum(s.phase is not SlotPhase.FREE for s in self._slots))
