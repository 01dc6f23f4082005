"""Tick pacing: drift-free deadlines, bounded back-to-back catch-up after overruns."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.lockstep import LockstepScheduler, SlotLease, TickOutcome, TickPacer, TickReport
from tests.clocks import FakeTickClock
from tests.engines.lockstep.lockstep_fakes import FRAME, PERIOD, ClientFeedingClock, RecordingModel, metric

BACKLOG_CAP = round(LockstepConfig().max_input_backlog_ms * 100 / 1000) // FRAME  # frames at 100 Hz: the catch-up bound


def step_seconds(tick: int) -> float:
    """A step that usually fits the 80 ms budget and sometimes overruns it."""
    if tick == 100:
        return 0.25  # a long stall: three deadlines go by
    return 0.13 if tick % 25 == 7 else 0.03


def run_pacer(pacer: TickPacer, clock: FakeTickClock, ticks: int, work: Callable[[int], float]) -> list[TickOutcome]:
    outcomes = []
    for tick in range(ticks):
        pacer.wait()
        clock.advance(work(tick))
        outcomes.append(pacer.finish())
    return outcomes


def test_after_an_overrun_the_missed_tick_runs_at_once_then_the_grid_resumes() -> None:
    clock = FakeTickClock(start=1000.0)
    pacer = TickPacer(clock, PERIOD, max_behind=BACKLOG_CAP)
    pacer.restart()
    ticks = run_pacer(pacer, clock, 6, lambda tick: 0.13 if tick == 3 else 0.03)

    assert [t.index for t in ticks] == [0, 1, 2, 3, 4, 5]  # no deadline given up
    overran, missed, resumed = ticks[3], ticks[4], ticks[5]
    assert overran.overrun_s == pytest.approx(0.05) and overran.behind == 1 and overran.skipped == 0
    # The missed tick starts the moment the long one ends, without sleeping...
    assert missed.catch_up and missed.started == pytest.approx(1000.0 + 3 * PERIOD + 0.13)
    assert missed.lateness_s == pytest.approx(0.05) and missed.overrun_s == 0.0
    # ...and the next one is back on its deadline.
    assert not resumed.catch_up and resumed.started == pytest.approx(1000.0 + 5 * PERIOD)
    assert all(t.deadline == 1000.0 + t.index * PERIOD for t in ticks)  # computed from the index


def test_overruns_within_the_catch_up_bound_lose_no_tick_and_keep_the_grid() -> None:
    clock = FakeTickClock(start=1000.0)
    pacer = TickPacer(clock, PERIOD, max_behind=BACKLOG_CAP)
    pacer.restart()
    window = 200 * PERIOD
    ticks: list[TickOutcome] = []
    while pacer.deadline() < 1000.0 + window - 1e-9:
        pacer.wait()
        clock.advance(step_seconds(len(ticks)))
        ticks.append(pacer.finish())

    assert len(ticks) == 200  # one tick per period of the window: every client frame gets its tick
    assert [t.index for t in ticks] == list(range(200))
    assert sum(t.skipped for t in ticks) == 0
    injected = [i for i in range(200) if step_seconds(i) > PERIOD]
    assert [i for i, t in enumerate(ticks) if t.overrun_s > 0] == injected  # 8 x 130 ms + 1 x 250 ms
    assert ticks[100].behind == 3
    for i in injected:
        assert ticks[i + 1].catch_up  # the missed deadline runs right after the overrun
    caught_up = [i for i, t in enumerate(ticks) if t.catch_up]
    assert len(caught_up) == 8 * 1 + 4  # 250 ms of debt takes four 30 ms ticks to pay back
    # Lateness is bounded by the stall and gone soon after it: no drift, no accumulation.
    assert max(t.lateness_s for t in ticks) == pytest.approx(0.25 - PERIOD)
    assert all(t.lateness_s == 0.0 for i, t in enumerate(ticks) if i not in caught_up)
    assert ticks[-1].started == 1000.0 + 199 * PERIOD


def test_a_stall_beyond_the_backlog_cap_skips_the_excess_deadlines() -> None:
    clock = FakeTickClock()
    pacer = TickPacer(clock, PERIOD, max_behind=4)
    pacer.restart()
    ticks = run_pacer(pacer, clock, 6, lambda tick: 1.0 if tick == 0 else 0.0)

    stall = ticks[0]
    # Deadlines 1..12 (80..960 ms) went by: the newest 4 are caught up, the older 8 skipped.
    assert stall.overrun_s == pytest.approx(1.0 - PERIOD) and stall.behind == 4 and stall.skipped == 8
    assert [t.index for t in ticks[1:]] == [9, 10, 11, 12, 13]
    assert all(t.catch_up and t.started == pytest.approx(1.0) for t in ticks[1:5])
    assert not ticks[5].catch_up and ticks[5].started == pytest.approx(13 * PERIOD)


def test_an_overloaded_engine_falls_behind_by_at_most_the_cap() -> None:
    clock = FakeTickClock()
    pacer = TickPacer(clock, PERIOD, max_behind=4)
    pacer.restart()
    ticks = run_pacer(pacer, clock, 200, lambda tick: 1.5 * PERIOD)  # never fits the budget

    assert all(t.behind <= 4 for t in ticks)
    assert max(t.lateness_s for t in ticks) < 5 * PERIOD  # bounded: no spiral of ever-later ticks
    # The engine runs 2 ticks per 3 periods; the rest of the deadlines are skipped and counted.
    assert ticks[-1].index + 1 == pytest.approx(200 * 1.5, abs=6)
    assert sum(t.skipped for t in ticks) == pytest.approx(100, abs=6)


def test_an_exactly_full_tick_is_not_an_overrun() -> None:
    clock = FakeTickClock()
    pacer = TickPacer(clock, PERIOD, max_behind=BACKLOG_CAP)
    pacer.wait()
    clock.advance(PERIOD)
    outcome = pacer.finish()
    assert outcome.overrun_s == 0.0 and outcome.behind == 0 and outcome.skipped == 0
    assert pacer.wait() == pytest.approx(PERIOD)
    assert not pacer.finish().catch_up


def run_scheduler_on_fake_clock(
    clock: FakeTickClock,
    model: RecordingModel,
    registry: CollectorRegistry,
    ticks: int,
    work: Callable[[int], float],
    observe: Callable[[TickReport], None] | None = None,
    prepare: Callable[[SlotLease], None] | None = None,
    **config: object,
) -> list[TickReport]:
    """Start a scheduler with one live slot and collect the reports of its first ``ticks`` ticks."""

    def simulate(index: int) -> None:
        clock.advance(work(index))
        if index >= ticks:
            time.sleep(0.01)  # the test has its ticks: slow the free-running fake clock until stop()

    model.step_hook = simulate
    reports: list[TickReport] = []
    enough = threading.Event()

    def collect(report: TickReport) -> None:
        if len(reports) < ticks:
            reports.append(report)
            if observe is not None:
                observe(report)
        else:
            enough.set()

    scheduler = LockstepScheduler(model, LockstepConfig(**config), registry, clock=clock, on_tick=collect)
    lease = scheduler.acquire()
    if prepare is not None:
        prepare(lease)
    scheduler.start()
    try:
        assert enough.wait(30)
    finally:
        scheduler.stop(5)
    return reports


def test_scheduler_on_a_fake_clock_catches_up_and_counts_overruns(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeTickClock(start=50.0)
    model = RecordingModel(batch_size=2, frame_size=8, sample_rate=100)  # 80 ms frames
    registry = CollectorRegistry()
    reports = run_scheduler_on_fake_clock(clock, model, registry, 200, step_seconds)

    origin = reports[0].deadline
    assert [r.index for r in reports] == list(range(200))  # every deadline ran: none skipped
    for report in reports:
        assert report.deadline == pytest.approx(origin + report.index * PERIOD, abs=1e-9)
    injected = [i for i in range(200) if step_seconds(i) > PERIOD]
    assert [i for i, r in enumerate(reports) if r.overrun_s > 0] == injected
    assert all(reports[i + 1].catch_up for i in injected)
    assert reports[-1].lateness_s == pytest.approx(0.0, abs=1e-9)  # back on the grid
    assert metric(registry, "rtserve_lockstep_overruns_total") >= 9
    assert metric(registry, "rtserve_lockstep_catch_up_ticks_total") >= 12
    assert metric(registry, "rtserve_lockstep_skipped_deadlines_total") == 0
    assert metric(registry, "rtserve_lockstep_frame_budget_seconds") == pytest.approx(PERIOD)
    overrun_logs = [r for r in caplog.records if "overran" in r.getMessage()]
    assert overrun_logs and all(r.levelname == "WARNING" for r in overrun_logs)
    assert len(overrun_logs) < 9  # rate-limited, not one line per overrun


@pytest.mark.parametrize("stall_s", [0.25, 1.0, 1.5])
def test_input_latency_returns_to_normal_after_an_overrun(stall_s: float) -> None:
    """Default config. A stall of the engine thread within the input backlog bound (1.2 s) loses
    no input: the missed ticks run back to back. Beyond it, the excess is dropped and counted."""
    clock = ClientFeedingClock()
    model = RecordingModel(batch_size=2, frame_size=8, sample_rate=100)  # 80 ms frames
    registry = CollectorRegistry()
    stepped: list[float] = []  # the input frame value each tick stepped (0: silence)
    backlog: list[int] = []  # input samples still queued after each tick
    leases: list[SlotLease] = []

    def prepare(lease: SlotLease) -> None:
        clock.lease = lease
        leases.append(lease)

    def observe(report: TickReport) -> None:
        item = leases[0].output.pop()  # the echo of this tick's input (the engine thread is its only reader)
        assert item is not None
        stepped.append(float(item[0].audio[0]))
        backlog.append(len(leases[0].input))

    reports = run_scheduler_on_fake_clock(
        clock, model, registry, 40, lambda tick: stall_s if tick == 10 else 0.01, observe=observe, prepare=prepare
    )
    lease = leases[0]
    skipped = sum(r.skipped for r in reports)

    assert stepped[0] == 0.0  # the first tick ran before the client's first frame
    delivered = [value for value in stepped if value > 0]  # 0: a silent (underrun) tick
    assert delivered == sorted(delivered) and len(set(delivered)) == len(delivered)  # in order, no repeats
    # Input latency (tick start - the stepped frame's send time) is back to its steady half period
    # within a few ticks of the stall: the overrun did not leave frames queued.
    latency = [
        (i, r.started - clock.arrivals[int(value) - 1])
        for i, (r, value) in enumerate(zip(reports, stepped))
        if value > 0
    ]
    recovered = next(i for i, r in enumerate(reports) if i > 10 and not r.catch_up)
    # At most BACKLOG_CAP deadlines behind, gaining 70 ms on each 10 ms catch-up tick.
    assert recovered <= 10 + math.ceil(BACKLOG_CAP * PERIOD / (PERIOD - 0.01)) + 2
    assert all(lat == pytest.approx(PERIOD / 2) for i, lat in latency if i < 10 or i >= recovered)
    assert max(backlog[recovered:]) <= FRAME
    if stall_s < BACKLOG_CAP * PERIOD:  # within the catch-up bound: no frame lost, no deadline skipped
        assert skipped == 0 and lease.samples_discarded == 0 and lease.underruns == 1
        assert delivered == [float(k) for k in range(1, 40)]
    else:
        # Beyond it, the backlog cap dropped the frames of the skipped deadlines; the frame the next
        # on-time tick would have stepped may arrive during the stall too, be consumed by the last
        # catch-up tick and leave that next tick one silent frame (once).
        assert skipped == int(stall_s / PERIOD) - BACKLOG_CAP
        assert skipped * FRAME <= lease.samples_discarded <= (skipped + 1) * FRAME
        assert lease.underruns <= 2
        assert metric(registry, "rtserve_lockstep_dropped_input_frames_total") == lease.samples_discarded / FRAME


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

    assert {i for i, r in enumerate(reports) if r.overrun_s > 0} >= injected  # every injected overrun is seen
    assert all(reports[i + 1].catch_up for i in injected)  # and its missed deadline was run right after
    assert metric(registry, "rtserve_lockstep_overruns_total") >= len(injected)
    # Deadlines stay on the grid of the first one...
    origin = reports[0].deadline
    for report in reports:
        assert report.deadline == pytest.approx(origin + report.index * PERIOD, abs=1e-6)
    # ...and catch-up makes 200 ticks take 200 periods: the overruns cost no deadline (skipping them
    # would have taken 8 periods longer), and lateness does not accumulate. The upper bound leaves the
    # last tick 6 periods (480 ms) of scheduling delay on a loaded machine, short of the 8 a skip costs.
    elapsed = reports[-1].started - reports[0].started
    assert 199 * PERIOD - PERIOD / 2 < elapsed < 199 * PERIOD + 6 * PERIOD
    early = statistics.median(r.lateness_s for r in reports[:20])
    late = statistics.median(r.lateness_s for r in reports[-20:])
    assert late < early + PERIOD / 4
    assert max(r.lateness_s for r in reports) < (BACKLOG_CAP + 1) * PERIOD


def run_late_frames_client(
    late: dict[int, float], **config: object
) -> tuple[SlotLease, dict[int, float], list[float], CollectorRegistry]:
    """40 ticks of a one-frame-per-period client whose frames in ``late`` arrive after their tick.
    Returns the lease, input latency per tick that stepped a frame, the stepped values, the registry."""
    clock = ClientFeedingClock(late=late)
    model = RecordingModel(batch_size=2, frame_size=8, sample_rate=100)  # 80 ms frames
    registry = CollectorRegistry()
    stepped: list[float] = []
    leases: list[SlotLease] = []

    def prepare(lease: SlotLease) -> None:
        clock.lease = lease
        leases.append(lease)

    def observe(report: TickReport) -> None:
        item = leases[0].output.pop()
        assert item is not None
        stepped.append(float(item[0].audio[0]))

    reports = run_scheduler_on_fake_clock(
        clock, model, registry, 40, lambda tick: 0.01, observe=observe, prepare=prepare, **config
    )
    latency = {
        i: r.started - clock.arrivals[int(value) - 1] for i, (r, value) in enumerate(zip(reports, stepped)) if value > 0
    }
    return leases[0], latency, stepped, registry


def assert_in_order_with_missing(stepped: list[float], missing: int) -> None:
    delivered = [int(v) for v in stepped if v > 0]
    assert delivered == sorted(delivered)
    assert len(set(range(1, delivered[-1] + 1)) - set(delivered)) == missing


@pytest.mark.parametrize("trim_window", [5, None])
def test_without_a_cushion_a_late_frame_adds_latency_only_until_the_window_ends(trim_window: int | None) -> None:
    """Frame 10 arrives just after its tick: that tick plays silence and every later frame
    waits one extra period, until the adaptive backlog drops the standing frame."""
    lease, latency, stepped, registry = run_late_frames_client(
        {10: 0.7 * PERIOD}, latency_trim_window_frames=trim_window, jitter_cushion_ms=0, drift_trim_ms=PERIOD * 1000
    )  # whole frames, so latencies stay on the frame grid
    assert all(latency[i] == pytest.approx(PERIOD / 2) for i in range(1, 11))
    assert 11 not in latency  # the tick the late frame missed stepped silence
    assert latency[12] == pytest.approx(1.5 * PERIOD)
    assert lease.underruns == 2 and lease.samples_discarded == 0
    if trim_window is None:  # without trimming the extra period stays for good
        assert all(latency[i] == pytest.approx(1.5 * PERIOD) for i in range(12, 40))
        assert lease.samples_trimmed == 0
        return
    assert lease.samples_trimmed == FRAME
    assert metric(registry, "rtserve_lockstep_trimmed_input_samples_total") == FRAME
    assert all(latency[i] == pytest.approx(PERIOD / 2) for i in range(12 + 2 * trim_window, 40))
    assert_in_order_with_missing(stepped, 1)


def test_a_one_frame_cushion_absorbs_late_frames_and_never_grows() -> None:
    """With a one-frame jitter cushion, the first late frame leaves one spare frame (kept:
    later late frames then cost nothing); a second standing frame is trimmed, so latency
    stays at +1 period."""
    lease, latency, stepped, _ = run_late_frames_client(
        {10: 0.7 * PERIOD, 20: 0.7 * PERIOD, 30: 1.7 * PERIOD},
        latency_trim_window_frames=3,
        jitter_cushion_ms=PERIOD * 1000,
        drift_trim_ms=PERIOD * 1000,
    )
    assert latency[12] == pytest.approx(1.5 * PERIOD)
    # The first tick, the one frame 10 missed, and the one frame 30 missed (late by more than the
    # cushion); frame 20's lateness cost nothing.
    assert lease.underruns == 3
    assert lease.samples_trimmed == FRAME  # frame 30 left a second spare frame behind: trimmed
    assert all(latency[i] == pytest.approx(1.5 * PERIOD) for i in range(12, 30))
    assert max(latency.values()) <= 2.5 * PERIOD + 1e-9
    assert all(latency[i] == pytest.approx(1.5 * PERIOD) for i in range(38, 40))
    assert_in_order_with_missing(stepped, 1)


def test_a_late_tick_reports_when_it_was_due_not_when_it_started() -> None:
    """Workers aim their uplink at the ticks' schedule (``last_tick_due``); a catch-up tick that
    started late must not shift it, or their next flush would miss the following tick."""
    clock = FakeTickClock(start=50.0)
    model = RecordingModel(batch_size=2, frame_size=8, sample_rate=100)  # 80 ms frames
    schedulers: list[LockstepScheduler] = []
    ages: list[tuple[float, float]] = []  # (real seconds since the reported due time, the tick's lateness)

    def observe(report: TickReport) -> None:
        due = schedulers[0].last_tick_due()
        assert due is not None
        ages.append((time.monotonic() - due, report.lateness_s))

    run_scheduler_on_fake_clock(
        clock,
        model,
        CollectorRegistry(),
        60,
        step_seconds,
        observe,
        prepare=lambda lease: schedulers.append(lease.scheduler),
    )
    assert any(lateness > PERIOD / 4 for _, lateness in ages)  # some ticks ran late, catching up
    for age, lateness in ages:
        assert lateness - 1e-3 <= age < lateness + 0.5  # the due time: its lateness ago, on the tick clock
