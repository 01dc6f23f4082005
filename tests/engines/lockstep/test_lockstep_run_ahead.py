"""Running ahead of playback (docs/engines.md#running-ahead-of-playback): a model without audio
input whose ready rows may step ahead of the ticks does so while their readers have room, holds a
row whose reader is a full queue behind (no audio lost), and falls back to one tick per period
when no row is ready; a row read at playback pace is topped up by the ticks and a step for every few
frames taken, not one per frame; a scheduler without ``run_ahead`` keeps its pace."""

from __future__ import annotations

import asyncio
import functools
import time

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.lockstep.lease import SlotLease
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.engines.values import FrameOutput
from tests.engines.lockstep.lockstep_fakes import RecordingModel

PERIOD_S = 0.08  # RecordingModel: 8 samples at 100 Hz
QUEUE = 4


class TextModel(RecordingModel):
    """Each row steps while it has frames left to say (``say``), one output per step."""

    def __init__(self, batch_size: int = 2) -> None:
        super().__init__(batch_size=batch_size)
        self.left = np.zeros(self.batch_size, int)
        self.stepped = np.zeros(self.batch_size, int)
        self.work_s = 0.0  # how long a step takes

    def say(self, slot: int, frames: int) -> None:
        self.left[slot] += frames

    def ready_rows(self) -> np.ndarray:
        return self.left > 0

    def step(self, frames: np.ndarray, live: np.ndarray) -> list[FrameOutput | None]:
        self.steps += 1
        time.sleep(self.work_s)
        go = live & (self.left > 0)
        self.left[go] -= 1
        self.stepped[go] += 1
        return [FrameOutput(np.zeros(self.frame_size, np.float32)) if go[i] else None for i in range(self.batch_size)]


def _scheduler(
    *, ahead: bool, queue: int = QUEUE, refill: int = 1, rows: int = 2
) -> tuple[LockstepScheduler, TextModel]:
    model = TextModel(rows)
    config = LockstepConfig(output_queue_frames=queue, run_ahead_refill_frames=refill)
    scheduler = LockstepScheduler(
        model, config, CollectorRegistry(), audio_input=False, run_ahead=model if ahead else None
    )
    scheduler.start()
    return scheduler, model


async def _read(lease: SlotLease, frames: int) -> None:
    for _ in range(frames):
        item = await lease.next_output()
        assert isinstance(item, tuple)


async def _say_and_time(scheduler: LockstepScheduler, model: TextModel, frames: int) -> float:
    lease = scheduler.acquire()
    started = time.monotonic()
    scheduler.between_steps(lease, lambda: model.say(lease.slot, frames))
    await asyncio.wait_for(_read(lease, frames), 10)
    elapsed = time.monotonic() - started
    lease.release()
    return elapsed


async def test_a_ready_row_steps_as_fast_as_its_reader_takes_the_frames() -> None:
    scheduler, model = _scheduler(ahead=True)
    try:
        elapsed = await _say_and_time(scheduler, model, 25)  # 2 s of ticks
        assert elapsed < 0.5, elapsed
    finally:
        scheduler.stop(2.0)


async def test_without_run_ahead_the_same_row_is_paced() -> None:
    scheduler, model = _scheduler(ahead=False)
    try:
        elapsed = await _say_and_time(scheduler, model, 10)
        assert elapsed >= 9 * PERIOD_S, elapsed
    finally:
        scheduler.stop(2.0)


async def test_a_row_whose_reader_is_behind_waits_without_losing_frames_while_another_runs_ahead() -> None:
    scheduler, model = _scheduler(ahead=True)
    try:
        stalled, reading = scheduler.acquire(), scheduler.acquire()
        scheduler.between_steps(stalled, lambda: model.say(stalled.slot, 20))
        scheduler.between_steps(reading, lambda: model.say(reading.slot, 20))
        await asyncio.wait_for(_read(reading, 20), 5)  # ran ahead while the other one's queue was full
        assert model.stepped[stalled.slot] == QUEUE and stalled.dropped_output_frames == 0
        await asyncio.wait_for(_read(stalled, 20), 10)  # the held row resumes as its reader takes frames
        assert stalled.dropped_output_frames == 0 and model.stepped[stalled.slot] == 20
    finally:
        scheduler.stop(2.0)


async def test_with_no_row_ready_it_falls_back_to_one_tick_a_period() -> None:
    scheduler, model = _scheduler(ahead=True)
    try:
        lease = scheduler.acquire()
        await asyncio.sleep(0.5)
        assert 3 <= model.steps <= 8, model.steps  # about 0.5 s / 80 ms, not a busy loop
        lease.release()
    finally:
        scheduler.stop(2.0)


async def test_readers_at_playback_pace_are_topped_up_together_not_one_frame_each() -> None:
    """Each step costs the whole batch (here 30 ms of a period's 80). Four rows read at playback
    pace, a quarter period apart: with a step out of the tick whenever a row has room, a frame
    read during one step calls for the next, back to back; with ``run_ahead_refill_frames`` 4 the
    tick tops every queue up, one call a period. No frame is lost either way."""
    calls = {}
    for refill in (1, 4):
        scheduler, model = _scheduler(ahead=True, queue=8, refill=refill, rows=4)
        model.work_s = 0.03
        try:
            leases = [scheduler.acquire() for _ in range(4)]
            for lease in leases:
                scheduler.between_steps(lease, functools.partial(model.say, lease.slot, 60))
            await asyncio.sleep(0.3)  # the queues fill

            async def play(lease: SlotLease, offset_s: float) -> None:
                await asyncio.sleep(offset_s)
                for _ in range(12):  # ~1 s of playback
                    assert isinstance(await asyncio.wait_for(lease.next_output(), 2), tuple)
                    await asyncio.sleep(PERIOD_S)

            before = model.steps
            await asyncio.gather(*(play(lease, k * PERIOD_S / 4) for k, lease in enumerate(leases)))
            calls[refill] = model.steps - before
            assert all(lease.dropped_output_frames == 0 for lease in leases)
        finally:
            scheduler.stop(2.0)
    assert calls[4] < 0.6 * calls[1], calls
