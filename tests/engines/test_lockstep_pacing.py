"""Tick pacing: drift-free deadlines, overruns skip ahead instead of bursting."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from lockstep_fakes import RecordingModel, metric
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.lockstep import FakeTickClock, LockstepScheduler, TickPacer, TickReport

PERIOD = 0.08


def step_seconds(tick: int) -> float:
    """A step that usually fits the 80 ms budget and sometimes overruns it."""
    if tick == 100:
        return 0.25  # a long stall: three deadlines go by
    return 0.13 if tick % 25 == 7 else 0.03


def test_pacer_on_a_fake_clock_never_drifts_or_bursts() -> None:
    clock = FakeTickClock(start=1000.0)
    pacer = TickPacer(clock, PERIOD)
    pacer.restart()
    starts, indices, overruns, skipped = [], [], 0, 0
    for tick in range(200):
        deadline = pacer.wait()
        starts.append(clock.monotonic())
        indices.append(pacer.index)
        assert deadline == 1000.0 + pacer.index * PERIOD  # computed from the index, never summed
        clock.advance(step_seconds(tick))
        outcome = pacer.finish()
        overruns += outcome.skipped > 0
        skipped += outcome.skipped
    injected = [t for t in range(200) if step_seconds(t) > PERIOD]
    assert overruns == len(injected) == 9
    assert skipped == 8 * 1 + 3  # 130 ms skips one deadline, 250 ms skips three
    assert indices[-1] == 199 + skipped
    # No tick ever starts late on an ideal clock, and none bursts to catch up.
    assert all(start == 1000.0 + index * PERIOD for start, index in zip(starts, indices))
    assert min(b - a for a, b in zip(starts, starts[1:])) >= PERIOD - 1e-9
    assert starts[-1] - starts[0] == pytest.approx((199 + skipped) * PERIOD)


def test_an_exactly_full_tick_is_not_an_overrun() -> None:
    clock = FakeTickClock()
    pacer = TickPacer(clock, PERIOD)
    pacer.wait()
    clock.advance(PERIOD)
    assert pacer.finish().skipped == 0
    assert pacer.wait() == pytest.approx(PERIOD)


def test_scheduler_thread_on_a_fake_clock_counts_overruns_and_keeps_the_grid(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeTickClock(start=50.0)
    model = RecordingModel(batch_size=2, frame_size=8, sample_rate=100)  # 80 ms frames

    def simulate(index: int) -> None:
        clock.advance(step_seconds(index))
        if index >= 200:
            time.sleep(0.01)  # the test has its ticks: slow the free-running fake clock until stop()

    model.step_hook = simulate
    registry = CollectorRegistry()
    reports: list[TickReport] = []
    enough = threading.Event()

    def observe(report: TickReport) -> None:
        if len(reports) < 200:
            reports.append(report)
        else:
            enough.set()

    scheduler = LockstepScheduler(model, LockstepConfig(), registry, clock=clock, on_tick=observe)
    scheduler.acquire()
    scheduler.start()
    try:
        assert enough.wait(30)
    finally:
        scheduler.stop(5)
    origin = reports[0].deadline
    for before, after in zip(reports, reports[1:]):
        assert after.index == before.index + 1 + before.skipped  # skip ahead, never burst
        assert after.deadline == pytest.approx(origin + after.index * PERIOD, abs=1e-9)
        assert after.lateness_s == 0.0  # overruns never turn into accumulated latency
    assert sum(r.skipped > 0 for r in reports) == 9
    assert metric(registry, "rtserve_lockstep_overruns_total") >= 9
    assert metric(registry, "rtserve_lockstep_frame_budget_seconds") == pytest.approx(PERIOD)
    overrun_logs = [r for r in caplog.records if "overran" in r.getMessage()]
    assert overrun_logs and all(r.levelname == "WARNING" for r in overrun_logs)
    assert len(overrun_logs) < 9  # rate-limited, not one line per overrun


@pytest.mark.slow
def test_real_clock_200_ticks_at_80ms_hold_the_schedule() -> None:
    """Real time, 16 s: bounds are loose enough for a loaded 2-core machine."""
    model = RecordingModel(batch_size=4, frame_size=1920, sample_rate=24_000)
    injected = {t for t in range(200) if t % 25 == 7}  # 8 steps of 120 ms
    model.step_hook = lambda index: time.sleep(0.12) if index in injected else None
    registry = CollectorRegistry()
    reports: list[TickReport] = []
    enough = threading.Event()

    def observe(report: TickReport) -> None:
        if len(reports) < 200:
            reports.append(report)
        else:
            enough.set()

    scheduler = LockstepScheduler(model, LockstepConfig(), registry, on_tick=observe)
    scheduler.acquire()
    scheduler.start()
    try:
        assert enough.wait(60)
    finally:
        scheduler.stop(5)

    assert {i for i, r in enumerate(reports) if r.skipped} >= injected  # every injected overrun is seen
    assert metric(registry, "rtserve_lockstep_overruns_total") >= len(injected)
    skipped = sum(r.skipped for r in reports[:-1])
    # Deadlines stay on the grid of the first one...
    origin = reports[0].deadline
    for report in reports:
        assert report.deadline == pytest.approx(origin + report.index * PERIOD, abs=1e-6)
    # ...elapsed time is exactly the ticks run plus the deadlines given up, never more...
    elapsed = reports[-1].started - reports[0].started
    expected = (199 + skipped) * PERIOD
    assert expected - PERIOD / 2 < elapsed < expected + 5 * PERIOD
    assert 199 * PERIOD + 8 * PERIOD <= expected < 199 * PERIOD + 40 * PERIOD
    # ...and lateness does not grow: the last ticks start as close to their deadlines as the first.
    early = statistics.median(r.lateness_s for r in reports[:20])
    late = statistics.median(r.lateness_s for r in reports[-20:])
    assert late < early + PERIOD / 4
    assert max(r.lateness_s for r in reports) < 5 * PERIOD
