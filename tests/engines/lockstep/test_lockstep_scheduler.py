"""LockstepScheduler: slot phases, gather/step/scatter, fences, admission, control ops."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.lockstep import SlotLease, SlotPhase
from rtserve.engines.values import FrameOutput, SlotPrompt
from tests.engines.lockstep.lockstep_fakes import FRAME, RecordingModel, frame, make_scheduler, metric


def drain(lease) -> list:
    items = []
    while (item := lease.output.pop()) is not None:
        items.append(item)
    return items


def _phase(lease: SlotLease) -> SlotPhase:
    """The lease's phase as it is now: a tick moves it on, which an earlier assert's narrowing does not see."""
    return lease.phase


def test_live_slot_steps_one_frame_per_tick_and_underruns_get_silence() -> None:
    scheduler, _model, registry = make_scheduler()
    lease = scheduler.acquire()
    assert lease.phase is SlotPhase.PREFILL  # opened on the engine thread, at the next tick
    lease.push_samples(np.concatenate([frame(1.0), frame(2.0)]))
    assert scheduler.tick() and scheduler.tick()
    assert _phase(lease) is SlotPhase.LIVE
    assert scheduler.tick()  # no input left: stepped with silence
    outputs = [out.audio for out, _ in drain(lease)]
    assert [float(a[0]) for a in outputs] == [1.0, 2.0, 0.0]
    assert not outputs[2].any()
    assert lease.underruns == 1
    assert metric(registry, "rtserve_lockstep_underruns_total") == 1
    assert lease.samples_consumed == 2 * FRAME


def test_backlog_cap_drops_oldest_frames_and_counts_them() -> None:
    scheduler, _model, registry = make_scheduler(max_input_backlog_ms=3 * 80)
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(float(v)) for v in range(5)]))
    for _ in range(4):
        scheduler.tick()
    assert [float(out.audio[0]) for out, _ in drain(lease)] == [2.0, 3.0, 4.0, 0.0]
    assert lease.samples_discarded == 2 * FRAME
    assert metric(registry, "rtserve_lockstep_dropped_input_frames_total") == 2


def test_push_rejects_samples_that_are_not_float32_mono() -> None:
    scheduler, _, _ = make_scheduler()
    lease = scheduler.acquire()
    with pytest.raises(ValueError, match="float32"):
        lease.push_samples(np.zeros(7, np.float64))
    with pytest.raises(ValueError, match="float32"):
        lease.push_samples(np.zeros((2, 8), np.float32))
    assert lease.samples_pushed == 0


def test_epoch_fence_drops_queued_and_in_flight_output() -> None:
    scheduler, model, _ = make_scheduler()
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(1.0), frame(2.0)]))
    scheduler.tick()
    scheduler.tick()
    assert len(lease.output) == 2
    lease.set_epoch(1)  # barge-in: queued epoch-0 frames go at once
    assert len(lease.output) == 0

    # The epoch moves while a step is in flight: that step's output is fenced off too.
    model.step_hook = lambda index: lease.set_epoch(2)
    lease.push_samples(frame(3.0))
    scheduler.tick()
    assert drain(lease) == []
    model.step_hook = None

    lease.push_samples(frame(4.0))
    scheduler.tick()
    [(out, epoch)] = drain(lease)
    assert epoch == 2 and out.audio[0] == 4.0
    assert lease.samples_consumed == 4 * FRAME  # the model kept hearing the user throughout


def test_release_during_a_step_delivers_nothing_and_frees_the_slot_between_steps() -> None:
    scheduler, model, _ = make_scheduler(RecordingModel(batch_size=1))
    lease = scheduler.acquire()
    scheduler.tick()
    drain(lease)
    model.step_hook = lambda index: lease.release()
    scheduler.tick()
    assert drain(lease) == [] and lease.output.closed
    assert lease.phase is SlotPhase.DRAINING and not lease.released
    with pytest.raises(CapacityExhausted):
        scheduler.acquire()  # DRAINING still holds the slot
    model.step_hook = None
    assert scheduler.tick() is False  # applies the release, nothing live: no step
    assert lease.released and lease.phase is SlotPhase.FREE
    assert model.calls[-1] == ("release", 0)
    assert scheduler.acquire().slot == 0


def test_capacity_is_refused_at_once_even_while_a_step_is_running() -> None:
    scheduler, model, registry = make_scheduler(RecordingModel(batch_size=2))
    in_step, finish_step = threading.Event(), threading.Event()

    def block(index: int) -> None:
        in_step.set()
        finish_step.wait(10)

    model.step_hook = block
    first = scheduler.acquire()
    scheduler.acquire()
    scheduler.start()
    try:
        assert in_step.wait(5)
        # Admission must not wait for the engine thread (which is stuck in the step).
        with ThreadPoolExecutor(1) as pool, pytest.raises(CapacityExhausted) as refused:
            pool.submit(scheduler.acquire).result(timeout=5)
        assert refused.value.code == "resource_exhausted"
        assert metric(registry, "rtserve_lockstep_occupied_slots") == 2
        first.release()
    finally:
        finish_step.set()
        scheduler.stop(5)
    assert model.violations == []


def test_no_step_when_no_slot_is_live() -> None:
    scheduler, model, _ = make_scheduler()
    assert scheduler.tick() is False
    lease = scheduler.acquire()
    scheduler.tick()
    lease.release()
    assert scheduler.tick() is False
    assert scheduler.tick() is False
    assert [call[0] for call in model.calls] == ["open", "step", "release"]


def _thread_cpu_seconds(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_idle_engine_thread_sleeps_instead_of_spinning() -> None:
    scheduler, model, _ = make_scheduler()
    scheduler.start()
    try:
        lease = scheduler.acquire()
        deadline = time.monotonic() + 5
        while model.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        lease.release()
        while not (lease.released and scheduler.is_idle) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler.is_idle
        steps = model.steps
        assert scheduler._thread is not None
        native_id = scheduler._thread.native_id
        assert native_id is not None
        cpu_before = _thread_cpu_seconds(native_id)
        time.sleep(0.5)
        assert model.steps == steps  # nothing live: not a single step
        assert _thread_cpu_seconds(native_id) - cpu_before < 0.05  # asleep, not polling
    finally:
        scheduler.stop(5)


def test_control_ops_wait_for_the_step_in_flight() -> None:
    scheduler, model, _ = make_scheduler()
    in_step, finish_step = threading.Event(), threading.Event()

    def block(index: int) -> None:
        if index == 1:
            in_step.set()
            finish_step.wait(10)

    model.step_hook = block
    first = scheduler.acquire()
    scheduler.start()
    try:
        assert in_step.wait(5)
        second = scheduler.acquire()
        first.release()
        time.sleep(0.1)  # give a wrongly eager thread the chance to misbehave
        assert ("open", second.slot) not in model.calls
        assert ("release", first.slot) not in model.calls
        finish_step.set()
        deadline = time.monotonic() + 5
        while not first.released and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        finish_step.set()
        scheduler.stop(5)
    assert model.violations == []
    second_step = model.calls.index(("step", (0,)), model.calls.index(("step", (0,))) + 1)
    assert model.calls.index(("release", first.slot)) > second_step
    assert model.calls.index(("open", second.slot)) > second_step


def test_prefill_runs_one_step_per_tick_then_goes_live() -> None:
    scheduler, model, _ = make_scheduler()
    live = scheduler.acquire()
    scheduler.tick()
    lease = scheduler.acquire(SlotPrompt(text="ab"))  # two prefill steps
    lease.push_samples(frame(5.0))
    scheduler.tick()
    assert lease.phase is SlotPhase.PREFILL
    scheduler.tick()
    assert _phase(lease) is SlotPhase.LIVE
    assert drain(lease) == []  # nothing is delivered for prefill rows
    scheduler.tick()
    [(out, _)] = drain(lease)
    assert out.audio[0] == 5.0  # input queued during prefill is played once live
    slot = lease.slot
    assert [c for c in model.calls if c[0] != "step" and c[1] == slot] == [
        ("open", slot),
        ("prefill", slot),
        ("prefill", slot),
    ]
    live_rows = [c[1] for c in model.calls if c[0] == "step"]
    assert live_rows == [(live.slot,), (live.slot,), (live.slot,), (live.slot, slot)]


def test_slow_reader_loses_the_oldest_output_not_the_newest() -> None:
    scheduler, _model, registry = make_scheduler(output_queue_frames=2)
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(float(v)) for v in (1, 2, 3, 4)]))
    for _ in range(4):
        scheduler.tick()
    assert [float(out.audio[0]) for out, _ in drain(lease)] == [3.0, 4.0]
    assert lease.dropped_output_frames == 2
    assert metric(registry, "rtserve_lockstep_dropped_output_frames_total") == 2


def test_an_event_loop_stall_the_input_bound_absorbs_loses_no_output() -> None:
    """Default config: the loop (the output's reader) stalls for as long as the input backlog
    bound lasts while the engine thread keeps ticking; every frame is still there to read."""
    scheduler, _, registry = make_scheduler()
    lease = scheduler.acquire()
    stall_ticks = scheduler.input_backlog_samples // FRAME
    lease.push_samples(np.concatenate([frame(float(v)) for v in range(1, stall_ticks + 1)]))
    for _ in range(stall_ticks):
        scheduler.tick()
    assert [float(out.audio[0]) for out, _ in drain(lease)] == [float(v) for v in range(1, stall_ticks + 1)]
    assert lease.dropped_output_frames == 0
    assert metric(registry, "rtserve_lockstep_dropped_output_frames_total") == 0


def test_a_failing_step_fails_its_sessions_and_the_engine_keeps_serving() -> None:
    scheduler, model, registry = make_scheduler()
    a, b = scheduler.acquire(), scheduler.acquire()
    scheduler.tick()
    drain(a), drain(b)
    model.fail_next_step = True
    scheduler.tick()
    for lease in (a, b):
        assert lease.output.closed and lease.output.failure == EngineFailure(
            "engine_error", "the engine failed while serving this session"
        )
    assert metric(registry, "rtserve_lockstep_engine_failures_total") == 1
    scheduler.tick()  # frees both slots
    fresh = scheduler.acquire()
    fresh.push_samples(frame(7.0))
    scheduler.tick()
    [(out, _)] = drain(fresh)
    assert out.audio[0] == 7.0


def test_a_failing_open_fails_only_that_session() -> None:
    scheduler, model, _ = make_scheduler()
    good = scheduler.acquire()
    model.fail_open_for = {1}
    bad = scheduler.acquire()
    good.push_samples(frame(1.0))
    scheduler.tick()
    assert bad.output.failure is not None and bad.phase is SlotPhase.DRAINING
    [(out, _)] = drain(good)
    assert out.audio[0] == 1.0 and good.output.failure is None


def test_a_typed_refusal_at_open_reaches_the_session_with_its_code_and_is_no_engine_failure() -> None:
    scheduler, model, registry = make_scheduler()
    model.refuse_open_for = {0}
    refused = scheduler.acquire()
    scheduler.tick()
    assert refused.output.failure == EngineFailure(CapacityExhausted.code, "no KV memory for this slot")
    assert metric(registry, "rtserve_lockstep_engine_failures_total") == 0
    model.refuse_open_for = set()
    scheduler.tick()  # the refused slot is free again
    fresh = scheduler.acquire()
    fresh.push_samples(frame(2.0))
    scheduler.tick()
    [(out, _)] = drain(fresh)
    assert out.audio[0] == 2.0


def test_stop_fails_remaining_sessions_and_refuses_new_ones() -> None:
    scheduler, model, _ = make_scheduler()
    lease = scheduler.acquire()
    scheduler.start()
    scheduler.stop(5)
    assert lease.released
    assert lease.output.failure == EngineFailure("engine_unavailable", "the engine stopped")
    assert ("release", lease.slot) in model.calls
    with pytest.raises(EngineError) as refused:
        scheduler.acquire()
    assert refused.value.code == "engine_unavailable"


async def test_outputs_reach_the_event_loop_without_blocking_it() -> None:
    scheduler, _model, _ = make_scheduler()
    lease = scheduler.acquire()  # on the loop: outputs wake this loop
    scheduler.start()
    try:
        lease.push_samples(np.concatenate([frame(1.0), frame(2.0)]))
        got: list[float] = []
        while len(got) < 2:
            item = await asyncio.wait_for(lease.next_output(), 5)
            assert isinstance(item, tuple)
            out, _epoch = item
            if out.audio.any():
                got.append(float(out.audio[0]))
        assert got == [1.0, 2.0]
        lease.push_samples(frame(3.0))
        await asyncio.wait_for(lease.wait_input_consumed(), 5)
        assert lease.samples_consumed == 3 * FRAME
        lease.release()
        assert await lease.wait_released(5)
        assert await lease.next_output() is None
    finally:
        await asyncio.to_thread(scheduler.stop, 5)


class SlowOpeningModel(RecordingModel):
    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        time.sleep(0.03)  # a slot opening that clears device memory and syncs
        return super().open_slot(slot, prompt)


def test_a_tick_that_spends_its_time_opening_slots_shows_it_as_control_not_step() -> None:
    """The phases around the step are what tells a stall outside the model (openings, the rows'
    input, handing outputs back) from a slow step."""
    scheduler, _model, registry = make_scheduler(SlowOpeningModel())
    scheduler.acquire()
    scheduler.acquire()
    scheduler.tick()

    def phase(name: str, sample: str = "sum") -> float:
        return registry.get_sample_value(f"rtserve_lockstep_tick_phase_seconds_{sample}", {"phase": name}) or 0.0

    assert phase("control") >= 0.06
    assert metric(registry, "rtserve_lockstep_step_seconds_sum") < 0.03
    assert all(phase(name, "count") == 1 for name in ("control", "gather", "scatter"))
    parts = (
        phase("control") + phase("gather") + phase("scatter") + metric(registry, "rtserve_lockstep_step_seconds_sum")
    )
    assert parts == pytest.approx(metric(registry, "rtserve_lockstep_tick_seconds_sum"), abs=0.005)


def test_metrics_describe_the_batch_and_every_tick() -> None:
    scheduler, _model, registry = make_scheduler()
    assert metric(registry, "rtserve_lockstep_slots") == 4
    assert metric(registry, "rtserve_lockstep_frame_budget_seconds") == pytest.approx(0.08)
    scheduler.acquire()
    b = scheduler.acquire()
    assert metric(registry, "rtserve_lockstep_occupied_slots") == 2
    for _ in range(3):
        scheduler.tick()
    assert metric(registry, "rtserve_lockstep_live_slots") == 2
    assert metric(registry, "rtserve_lockstep_tick_seconds_count") == 3
    assert metric(registry, "rtserve_lockstep_step_seconds_count") == 3
    b.release()
    scheduler.tick()
    assert metric(registry, "rtserve_lockstep_live_slots") == 1
    assert metric(registry, "rtserve_lockstep_occupied_slots") == 1


def test_the_input_count_a_frame_gets_keeps_every_field_the_model_set() -> None:
    """The scheduler stamps each row's frame with its input count (``with_input_samples``, fields
    written out for speed): a field added to ``FrameOutput`` and not carried there would be lost."""
    values = {field.name: object() for field in fields(FrameOutput)}
    counted = FrameOutput(**values).with_input_samples(7)  # type: ignore[arg-type]
    assert counted.input_samples == 7
    assert all(getattr(counted, name) is value for name, value in values.items() if name != "input_samples")
