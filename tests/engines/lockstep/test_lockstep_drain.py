"""Drain steps (``DrainsInput``): input that waits in a backlog after a burst is paid back
between ticks, instead of staying as latency for the rest of the stream."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.lockstep import LockstepScheduler, SlotLease, TickReport
from rtserve.engines.values import FrameOutput, SlotPrompt
from tests.engines.lockstep.lockstep_fakes import FRAME, ClientFeedingClock, RecordingModel, metric

# What Kyutai STT runs with: no input is ever trimmed, silence stepped in an underrun is not repaid.
KEEP_ALL_INPUT = {"latency_trim_window_frames": None, "underrun_repay_ms": 0.0}
TICKS = 40
STALL = {10: 0.3}
FLUSHED = 6
FLUSH_VALUE = 100.0


class DrainingModel(RecordingModel):
    """Echoes input like ``RecordingModel``; ``step_rows`` steps only the rows asked for (10 ms);
    with ``burst_rows`` a drain of one row is a burst of 4 ms a frame (``step_rows_burst``)."""

    def __init__(self, clock: ClientFeedingClock, burst_rows: int = 0) -> None:
        super().__init__(batch_size=2, frame_size=FRAME, sample_rate=100)  # 80 ms frames
        self.clock = clock
        self.burst_rows = burst_rows
        self.held: list[tuple[int, ...]] = []  # per drain step: the rows left as they were
        self.bursts: list[int] = []  # per burst: its frames
        self.burst_slots: list[tuple[int, ...]] = []  # per burst: its slots

    def step_rows(self, frames: np.ndarray, stepped: np.ndarray) -> list[FrameOutput | None]:
        self._record("step_rows", tuple(int(i) for i in np.flatnonzero(stepped)))
        self.held.append(tuple(int(i) for i in np.flatnonzero(~stepped)))
        self.clock.advance(0.01)
        return [FrameOutput(frames[i].copy(), text="drain") if stepped[i] else None for i in range(self.batch_size)]

    def step_rows_burst(self, frames: np.ndarray, slots: np.ndarray) -> list[list[FrameOutput | None]]:
        assert slots.size <= self.burst_rows
        self.bursts.append(frames.shape[0])
        self.burst_slots.append(tuple(slots.tolist()))
        self.clock.advance(0.004 * frames.shape[0])
        outputs: list[list[FrameOutput | None]] = []
        for step in frames:
            output: list[FrameOutput | None] = [None] * self.batch_size
            for row, slot in enumerate(slots.tolist()):
                output[slot] = FrameOutput(step[row].copy(), text="burst")
            outputs.append(output)
        return outputs


def _serve(
    drains: bool,
    late: dict[int, float] | None = None,
    phase: float = 0.5,
    drain_after_ticks: int = 1,
    prefill: int = 0,
    grace: int = 0,
    flush_at: int | None = None,
    tick_s: float = 0.01,
    flush_between_ticks: bool = False,
    burst_rows: int = 0,
    standing_beside: int = 0,
    drain_room: float = 1.5,
) -> tuple[list[float], list[int], DrainingModel, CollectorRegistry, SlotLease]:
    """One paced client, frame k sent at (k + ``phase``) periods (``late``: network delay of the
    frames named), ticks of ``tick_s`` and drain steps of 10 ms: the frames each tick and drain
    step stepped (in order),
    and the input still queued after each tick (with its drain steps). ``prefill``: the slot's
    prefill steps before it takes input. ``flush_at``: after that tick the stream queues
    ``FLUSHED`` frames of ``FLUSH_VALUE`` and asks for them to be stepped now (``drain_soon``), as a
    turn's end that comes between two ticks. ``burst_rows``: the model's (``DrainingModel``).
    ``standing_beside``: a second stream gets that many frames at once with the flush, so the tick
    that applies the flush leaves them standing beside it. ``drain_room``: the scheduler's."""
    clock = ClientFeedingClock(late=late, phase=phase)
    model = DrainingModel(clock, burst_rows)
    registry = CollectorRegistry()
    stepped: list[float] = []
    backlog: list[int] = []
    leases: list[SlotLease] = []
    enough = threading.Event()

    def simulate(index: int) -> None:
        clock.advance(tick_s)
        if index >= TICKS:
            time.sleep(0.01)  # the test has its ticks: slow the free-running fake clock until stop()

    def observe(report: TickReport) -> None:
        if len(backlog) >= TICKS:
            enough.set()
            return
        # The tick's report comes before its drain steps: read what the previous tick's drains
        # stepped too, then this tick's echo.
        while (item := leases[0].output.pop()) is not None:
            stepped.append(float(item[0].audio[0]))
        backlog.append(len(leases[0].input))
        if len(backlog) == flush_at:
            if standing_beside:
                leases[1].push_samples(np.full(standing_beside * FRAME, -1.0, np.float32))
            leases[0].push_samples(np.full(FLUSHED * FRAME, FLUSH_VALUE, np.float32))
            scheduler.drain_soon(leases[0], FLUSHED)

    model.step_hook = simulate
    scheduler = LockstepScheduler(
        model,
        LockstepConfig(**KEEP_ALL_INPUT),
        registry,
        clock=clock,
        on_tick=observe,
        drains=model if drains else None,
        drain_after_ticks=drain_after_ticks,
        late_input_grace_ticks=grace,
        flush_between_ticks=flush_between_ticks,
        drain_room=drain_room,
    )
    lease = scheduler.acquire(SlotPrompt(text="x" * prefill))  # RecordingModel: one prefill step a character
    leases.append(lease)
    if standing_beside:
        leases.append(scheduler.acquire(SlotPrompt()))
    clock.lease = lease
    scheduler.start()
    try:
        assert enough.wait(30)
    finally:
        scheduler.stop(5)
    return stepped, backlog, model, registry, lease


def test_a_burst_after_a_network_stall_is_drained_and_latency_returns_to_normal() -> None:
    """Frame 10 is held up 0.3 s by the network; frames 11-13 queue behind it and all arrive at once."""
    stepped, backlog, model, registry, lease = _serve(drains=True, late=STALL)

    delivered = [value for value in stepped if value > 0]  # 0: a silent (underrun) step
    assert delivered == [float(k) for k in range(1, len(delivered) + 1)]  # every frame, in order, once
    # The stall left ticks 11-14 silent; once frames 10-13 arrived the drain steps took the extra ones
    # in the room left by the next ticks, so the backlog is back under a frame for good.
    assert max(backlog[:10]) < FRAME
    assert max(backlog[20:]) < FRAME
    assert metric(registry, "rtserve_lockstep_drained_input_frames_total") >= 3
    assert metric(registry, "rtserve_lockstep_drain_steps_total") == len(model.held)
    assert all(held == (1,) for held in model.held)  # the idle slot was held, never stepped on silence
    assert lease.samples_discarded == 0


def test_input_is_drained_only_once_it_stood_drain_after_ticks_takes() -> None:
    stepped, backlog, _, _, lease = _serve(drains=True, late=STALL, drain_after_ticks=6)

    burst = next(i for i, queued in enumerate(backlog) if queued >= FRAME)
    assert min(backlog[burst : burst + 5]) >= 3 * FRAME  # standing, not drained yet
    assert max(backlog[burst + 6 :]) < FRAME
    delivered = [value for value in stepped if value > 0]
    assert delivered == [float(k) for k in range(1, len(delivered) + 1)]
    assert lease.samples_discarded == 0


def test_without_drain_steps_the_burst_stays_as_latency() -> None:
    """The contrast: the same client on a model without drain steps keeps the burst queued."""
    _, backlog, model, registry, _ = _serve(drains=False, late=STALL)

    assert max(backlog[:10]) < FRAME
    assert min(backlog[20:]) >= 3 * FRAME
    assert not model.held and metric(registry, "rtserve_lockstep_drain_steps_total") == 0


@pytest.mark.parametrize("phase", [0.05, 0.5])
def test_a_client_on_time_is_never_drained(phase: float) -> None:
    """Frames that arrive after a tick's take (phase 0.05: during the tick's step) are on time for
    the next tick: a drain step taking them would leave that tick to step silence (an underrun:
    lasting latency for speech-to-text)."""
    stepped, backlog, model, registry, lease = _serve(drains=True, phase=phase)

    assert not model.held and metric(registry, "rtserve_lockstep_drain_steps_total") == 0
    assert lease.underruns == 1  # the first tick, before the client's first frame
    assert [value for value in stepped if value > 0] == [float(k) for k in range(1, TICKS)]
    assert max(backlog) <= FRAME  # phase 0.05: the next tick's frame, which came during this one


@pytest.mark.parametrize(("drains", "burst_rows"), [(True, 0), (True, 1), (False, 0)])
def test_a_prefilling_slot_is_stepped_in_drain_steps(drains: bool, burst_rows: int) -> None:
    """Kyutai STT's silence prefix: while a slot prefills, its client's audio waits. Drain steps
    advance the prefilling row too, so the prefill is done in the first tick's spare time and
    no audio stands behind it; without them each prefill step takes a tick and the audio that
    arrived meanwhile stays queued. A model with bursts steps a prefilling row one step a call."""
    stepped, backlog, model, _, lease = _serve(drains=drains, prefill=6, burst_rows=burst_rows)

    delivered = [value for value in stepped if value > 0]
    assert delivered == [float(k) for k in range(1, len(delivered) + 1)]
    if drains:
        assert max(backlog) < FRAME
        assert ("step_rows", (0,)) in model.calls
    else:
        assert min(backlog[8:]) >= 4 * FRAME
    assert lease.samples_discarded == 0


@pytest.mark.parametrize("grace", [0, 2])
def test_a_late_frame_is_held_for_not_stepped_over_with_silence(grace: int) -> None:
    """Frame 10 comes 0.1 s late: after the tick that would take it. Held for it (``grace`` 2),
    the tick steps the slot not at all and a drain step takes the frame when it is there: no
    silence is written into the stream. Without grace that tick steps silence (an underrun) and
    the frame stands behind it until drained."""
    stepped, backlog, _, registry, lease = _serve(drains=True, late={10: 0.1}, grace=grace)

    delivered = [value for value in stepped if value > 0]
    assert delivered == [float(k) for k in range(1, len(delivered) + 1)]
    assert max(backlog[20:]) < FRAME
    silent_steps = len(stepped) - len(delivered)
    if grace:
        assert lease.underruns == 0 and silent_steps == 0  # the first tick held too: nothing came yet
        assert metric(registry, "rtserve_lockstep_underruns_total") == 0
    else:
        assert lease.underruns == 2 and silent_steps == 2  # the first tick, and the late frame's


def test_a_client_that_goes_quiet_is_stepped_on_silence_after_the_grace() -> None:
    """A client that stops sending is idle, not late: after ``grace`` held ticks its slot steps on
    silence again (a Kyutai client's trailing markers still come back), owing nothing."""
    stepped, _, _, _, lease = _serve(drains=True, late={5: 1000.0}, grace=2)

    assert [value for value in stepped if value > 0] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stepped[5:] and all(value == 0.0 for value in stepped[5:])
    assert lease.underruns >= len(stepped) - 5 > 20  # (the scheduler ran a little past the reports)


def test_only_a_model_with_audio_input_drains() -> None:
    model = DrainingModel(ClientFeedingClock())
    with pytest.raises(ValueError, match="audio input"):
        LockstepScheduler(model, LockstepConfig(), CollectorRegistry(), audio_input=False, drains=model)


def test_flushed_frames_are_stepped_in_the_next_ticks_spare_time() -> None:
    """A stream that queues its model's delay of silence and flushes it (``drain_soon``) has those
    frames stepped by drain steps right after the next tick, not one a tick; the client's own
    frames go on, in order, one a tick."""
    stepped, backlog, _, registry, lease = _serve(drains=True, drain_after_ticks=30, flush_at=10)

    assert stepped.count(FLUSH_VALUE) == FLUSHED
    assert max(backlog[12:]) < FRAME  # nothing left standing
    assert metric(registry, "rtserve_lockstep_drained_input_frames_total") >= FLUSHED - 1
    steps = metric(registry, "rtserve_lockstep_drain_steps_total")
    assert metric(registry, "rtserve_lockstep_drain_step_seconds_count") == steps  # each timed
    client = [value for value in stepped if 0 < value < FLUSH_VALUE]
    assert client == [float(k) for k in range(1, len(client) + 1)]
    assert lease.samples_discarded == 0


def test_a_flush_between_ticks_is_stepped_at_once_not_after_the_next_tick() -> None:
    """With ``flush_between_ticks`` the flushed frames get their drain steps when the stream asks,
    so none stands at the next tick's take; without it they wait for that tick."""
    stepped, at_once, _, _, lease = _serve(drains=True, drain_after_ticks=30, flush_at=10, flush_between_ticks=True)
    _, after_tick, _, _, _ = _serve(drains=True, drain_after_ticks=30, flush_at=10)

    assert at_once[10] < FRAME
    assert after_tick[10] >= (FLUSHED - 1) * FRAME
    assert stepped.count(FLUSH_VALUE) == FLUSHED
    client = [value for value in stepped if 0 < value < FLUSH_VALUE]
    assert client == [float(k) for k in range(1, len(client) + 1)]  # the client's frames in order
    assert lease.samples_discarded == 0


def test_room_for_drain_steps_is_counted_in_drain_steps_not_ticks() -> None:
    """Ticks of 30 ms and drain steps of 10 (a model that steps a few rows in a batch of their own,
    Kyutai STT's flush rows): once a drain step has been timed, the 50 ms a tick leaves before the
    next holds four, so a flush of six frames is stepped by the tick after next, not one drain
    step a tick."""
    stepped, backlog, _, _, lease = _serve(drains=True, drain_after_ticks=30, flush_at=10, tick_s=0.03)

    assert stepped.count(FLUSH_VALUE) == FLUSHED
    assert max(backlog[12:]) < FRAME  # one drain step after the tick that took the flush, four after the next
    assert lease.samples_discarded == 0


def test_a_smaller_drain_room_fits_one_more_drain_step_a_period() -> None:
    """Ticks of 27 ms leave 53 ms of each 80 ms period and a drain step takes 10: at 1.5 drain steps
    of room four fit after a tick (a fifth would start with 13 ms left), at 1.15 five do, so a
    flush is a frame further along by the next tick; either way every frame is stepped, in order."""
    wide_stepped, wide, _, _, _ = _serve(drains=True, drain_after_ticks=30, flush_at=10, tick_s=0.027)
    tight_stepped, tight, _, _, _ = _serve(
        drains=True, drain_after_ticks=30, flush_at=10, tick_s=0.027, drain_room=1.15
    )

    assert wide[11] - tight[11] == FRAME
    for stepped in (wide_stepped, tight_stepped):
        assert stepped.count(FLUSH_VALUE) == FLUSHED
        client = [value for value in stepped if 0 < value < FLUSH_VALUE]
        assert client == [float(k) for k in range(1, len(client) + 1)]


def test_without_drain_steps_flushed_frames_go_a_tick_each() -> None:
    _, backlog, model, _, _ = _serve(drains=False, drain_after_ticks=30, flush_at=10)

    assert min(backlog[11:14]) >= (FLUSHED - 4) * FRAME
    assert not model.held


def test_a_flush_of_a_few_rows_is_stepped_in_bursts_counted_frame_by_frame() -> None:
    """A model that steps a few rows several frames a call (Kyutai STT's flush batch) gets a
    flush's frames in one or two calls: as many as fit before the next tick, at the tick's cost a
    frame until a burst was timed (70 ms left / (1.5 x 10 ms) = 4 frames), then at the burst's."""
    stepped, backlog, model, registry, lease = _serve(
        drains=True, drain_after_ticks=30, flush_at=10, flush_between_ticks=True, burst_rows=1
    )

    assert model.bursts[:2] == [4, FLUSHED - 4]
    assert backlog[10] < FRAME  # all stepped before the next tick's take
    assert stepped.count(FLUSH_VALUE) == FLUSHED
    client = [value for value in stepped if 0 < value < FLUSH_VALUE]
    assert client == [float(k) for k in range(1, len(client) + 1)]  # the client's frames in order
    steps = metric(registry, "rtserve_lockstep_drain_steps_total")
    assert steps == sum(model.bursts) and not model.held  # no single drain step
    assert metric(registry, "rtserve_lockstep_drain_step_seconds_count") == steps
    assert metric(registry, "rtserve_lockstep_drained_input_frames_total") == steps
    assert lease.samples_discarded == 0


def test_a_flush_goes_in_a_burst_before_input_that_only_stood() -> None:
    """When more streams wait than a burst holds, the flushing ones (a turn's end someone waits
    for) go first in a burst of their own; the other stream's standing frames follow."""
    stepped, backlog, model, _, lease = _serve(drains=True, flush_at=10, burst_rows=1, standing_beside=4)

    assert model.burst_slots[0] == (0,) and (1,) in model.burst_slots[1:]
    assert not model.held  # no step of both rows, the others held
    assert backlog[11] < FRAME
    assert stepped.count(FLUSH_VALUE) == FLUSHED
    assert lease.samples_discarded == 0


def test_a_flush_is_not_cut_to_one_frame_by_a_late_frame_beside_it() -> None:
    """A burst steps as many frames as its shortest row: a stream with one frame standing beside a
    flush, both fitting one burst, would cut the flush's burst to a frame. The flushing stream
    goes alone, its frames in as few bursts as the room allows; the other's frame after."""
    stepped, backlog, model, registry, lease = _serve(drains=True, flush_at=10, burst_rows=2, standing_beside=2)

    assert (0, 1) not in model.burst_slots and (1,) in model.burst_slots, model.burst_slots
    first_other = model.burst_slots.index((1,))
    assert model.burst_slots[:first_other] == [(0,)] * first_other and first_other >= 1
    assert model.bursts[0] > 1  # not cut to the other stream's one frame
    assert backlog[11] < FRAME
    assert stepped.count(FLUSH_VALUE) == FLUSHED
    assert metric(registry, "rtserve_lockstep_drain_burst_frames_count") == len(model.bursts)
    assert metric(registry, "rtserve_lockstep_drain_burst_frames_sum") == sum(model.bursts)
    assert lease.samples_discarded == 0
