"""The event-loop side of one lockstep slot: what a session holds while it owns a slot.

A ``SlotLease`` is the session's end of the slot's hand-off queues (input backlog,
output hand-off) and its fence (epoch); the engine thread owns the other end in
``scheduler.py``. Kept apart from the scheduler so each module has one side of the
thread boundary (docs/engines.md#lockstep-slot-table).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.config import LockstepConfig
from rtserve.engines.events import EngineFailure
from rtserve.engines.lockstep.log_throttle import LogThrottle
from rtserve.engines.lockstep.slots import InputBacklog, OutputHandoff, SlotPhase
from rtserve.engines.values import FrameOutput

if TYPE_CHECKING:
    from rtserve.engines.lockstep.scheduler import LockstepScheduler

log = logging.getLogger(__name__)

# Input dropped over the backlog bound is logged at once, then at most once per interval per slot.
_DROP_LOG_INTERVAL_S = 5.0


class NothingYet(enum.Enum):
    """``poll_output``'s answer while the lease is open and nothing is queued."""

    NOTHING_YET = enum.auto()


NOTHING_YET: Final = NothingYet.NOTHING_YET


class SlotLease:
    """A session's hold on one slot.

    Loop-side methods never block. Counters have one writer each: ``samples_pushed``,
    ``samples_discarded`` (cleared, or dropped over the backlog bound), ``samples_dropped``
    (over the bound) and ``pushed_at`` the loop; ``samples_consumed`` (stepped or trimmed),
    ``samples_trimmed``, ``ticks_stepped``, ``last_input_tick``, ``underruns``,
    ``dropped_output_frames`` and ``wake_order`` the engine thread. The async methods need the lease to have
    been acquired on a running loop.
    """

    def __init__(
        self,
        scheduler: LockstepScheduler,
        slot: int,
        session_id: str,
        loop: asyncio.AbstractEventLoop | None,
        config: LockstepConfig,
    ) -> None:
        self._scheduler = scheduler
        self.slot = slot
        self.session_id = session_id
        self.loop = loop
        self.epoch = 0
        self.input: InputBacklog = scheduler.inputs.hold(slot)
        self.output = OutputHandoff(config.output_queue_frames)
        self.released = False
        self.samples_pushed = 0
        self.samples_discarded = 0
        self.samples_dropped = 0  # over the backlog bound (part of samples_discarded)
        self.samples_consumed = 0
        self.samples_trimmed = 0
        self.ticks_stepped = 0
        self.last_input_tick = 0  # ticks_stepped when this slot last stepped some of its input
        self.underruns = 0
        self.dropped_output_frames = 0
        self.pushed_at = math.inf  # time.monotonic() of the newest push
        # When the newest input the last tick stepped arrived: a tick's leases are woken oldest
        # input first (LoopNotifier), as workers order their sessions (Uplink.in_delivery_order).
        self.wake_order = math.inf
        self._changed = asyncio.Event()
        self._listener: Callable[[], None] | None = None
        self._drop_log = LogThrottle(_DROP_LOG_INTERVAL_S)

    @property
    def scheduler(self) -> LockstepScheduler:
        return self._scheduler

    @property
    def phase(self) -> SlotPhase:
        return self._scheduler.phase_of(self)

    def push_samples(self, samples: FloatArray) -> None:
        """Queue float32 mono samples of any length; beyond the backlog bound the oldest are
        dropped, counted (``rtserve_lockstep_dropped_input_frames``) and logged."""
        if self.released or not samples.size:
            return
        if samples.ndim != 1 or samples.dtype != np.float32:
            raise ValueError("input must be a 1-D float32 array")
        dropped = self.input.push(samples)
        self.pushed_at = time.monotonic()
        self.samples_pushed += samples.size
        if dropped:
            self.samples_discarded += dropped
            self.samples_dropped += dropped
            self._scheduler.metrics.dropped_input_frames.inc(dropped / self._scheduler.frame_size)
            self._report_drop(dropped)

    def clear_input(self) -> None:
        self.samples_discarded += self.input.clear()

    def _report_drop(self, count: int) -> None:
        unlogged = self._drop_log.due(count, time.monotonic())
        if unlogged is None:
            return
        rate = self._scheduler.sample_rate
        log.warning(
            "%s slot %d: input arrived faster than the engine stepped it; %.0f ms of the oldest audio "
            "went over the %.0f ms backlog bound and was dropped (%.0f ms in this session)",
            self._scheduler.name,
            self.slot,
            unlogged * 1000 / rate,
            self.input.limit * 1000 / rate,
            self.samples_dropped * 1000 / rate,
            extra={"session_id": self.session_id},
        )

    def set_epoch(self, epoch: int) -> None:
        """Fence: queued frames of older epochs are dropped now, in-flight ones at scatter."""
        self.epoch = epoch
        self.output.purge_before(epoch)

    def release(self) -> None:
        """Stop all output now; the engine thread frees the slot between steps."""
        self._scheduler.release(self)

    def wake(self) -> None:
        self._changed.set()
        if self._listener is not None:
            self._listener()

    def on_wake(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` on the loop whenever the engine thread hands over output or the lease
        changes (the push-style alternative to awaiting ``next_output``)."""
        self._listener = listener

    def poll_output(self) -> tuple[FrameOutput, int] | EngineFailure | NothingYet | None:
        """Without waiting: the next ``(frame, epoch)`` of the current epoch; the failure or
        ``None`` once closed; ``NOTHING_YET`` while the lease is open and nothing is queued."""
        while (item := self.output.pop()) is not None:
            if not len(self.output):
                self._changed.set()  # wait_drained() may be waiting for the reader to catch up
            if item[1] == self.epoch:
                return item
        return self.output.failure if self.output.closed else NOTHING_YET

    async def next_output(self) -> tuple[FrameOutput, int] | EngineFailure | None:
        """The next ``(frame, epoch)`` of the current epoch; the failure or ``None`` once closed."""
        while (item := self.poll_output()) is NOTHING_YET:
            await self._wait_until(lambda: len(self.output) > 0 or self.output.closed)
        return item

    async def wait_live(self) -> None:
        """Until the slot finished its prefill and is stepped every tick (or the lease ended)."""
        await self._wait_until(lambda: self.phase is SlotPhase.LIVE or self.output.closed or self.released)

    async def wait_input_consumed(self) -> None:
        """Until every sample pushed so far was stepped, trimmed or discarded (or the lease ended).

        A partial frame needs no padding from the caller: the next tick takes it, padded.
        """
        target = self.samples_pushed
        await self._wait_until(
            lambda: self.samples_consumed + self.samples_discarded >= target or self.output.closed or self.released
        )

    async def wait_drained(self) -> None:
        """Until all input pushed so far was stepped, the model's answer to it was produced
        (its ``output_delay_frames`` later) and every produced frame was read (or the lease ended)."""
        await self.wait_input_consumed()
        due = self.last_input_tick + self._scheduler.output_delay_frames
        await self._wait_until(
            lambda: (self.ticks_stepped >= due and not len(self.output)) or self.output.closed or self.released
        )

    async def wait_released(self, timeout_s: float) -> bool:
        """Until the engine thread has freed the slot; False on timeout."""
        try:
            await asyncio.wait_for(self._wait_until(lambda: self.released), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        # Several waiters share one event: clear, re-check, then wait, so no wake-up is lost.
        while not predicate():
            self._changed.clear()
            if predicate():
                return
            await self._changed.wait()
