"""Running ahead of playback (docs/engines.md#running-ahead-of-playback): a model without audio
input whose ready rows may step ahead of the ticks does so while their readers have room, holds a
row whose reader is a full queue behind (no audio lost), and falls back to one tick per period
when no row is ready; a scheduler without ``run_ahead`` keeps its pace."""

from __future__ import annotations

import asyncio
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

    def __init__(self) -> None:
        super().__init__(batch_size=2)
        self.left = np.zeros(self.batch_size, int)
        self.stepped = np.zeros(self.batch_size, int)

    def say(self, slot: int, frames: int) -> None:
        self.left[slot] += frames

    def ready_rows(self) -> np.ndarray:
        return self.left > 0

    def step(self, frames: np.ndarray, live: np.ndarray) -> list[FrameOutput | None]:
        self.steps += 1
        go = live & (self.left > 0)
        self.left[go] -= 1
        self.stepped[go] += 1
        return [FrameOutput(np.zeros(self.frame_size, np.float32)) if go[i] else None for i in range(self.batch_size)]


def _scheduler(*, ahead: bool) -> tuple[LockstepScheduler, TextModel]:
    model = TextModel()
    config = LockstepConfig(output_queue_frames=QUEUE)
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
