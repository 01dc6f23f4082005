"""Prometheus families of one lockstep scheduler, registered on the app's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Multiples of the frame budget: resolution where it matters (around 1.0 = on budget), and 4 ms
# steps (at 80 ms) over the range where big batches' steps lie, so tick and step quantiles can be
# told apart (with 20 ms buckets, a tick p99 read as 59 ms beside a 40 ms step may be 1 ms over it).
_BUDGET_FRACTIONS = (
    *(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85),
    *(0.9, 0.95, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0),
)
# Up to a few periods: catch-up ticks after an overrun start that late by design.
_JITTER_FRACTIONS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


class LockstepMetrics:
    def __init__(self, registry: CollectorRegistry, period_s: float, total_slots: int) -> None:
        self.tick_seconds = Histogram(
            "rtserve_lockstep_tick_seconds",
            "Wall time of one tick: control ops, gather, step, scatter",
            buckets=[f * period_s for f in _BUDGET_FRACTIONS],
            registry=registry,
        )
        self.step_seconds = Histogram(
            "rtserve_lockstep_step_seconds",
            "Wall time of the batched model step alone",
            buckets=[f * period_s for f in _BUDGET_FRACTIONS],
            registry=registry,
        )
        phases = Histogram(
            "rtserve_lockstep_tick_phase_seconds",
            "Wall time of a tick's parts around the step: control (sessions opened, closed and "
            "called; prefill), gather (the rows' input into the batch), scatter (outputs to the sessions)",
            ["phase"],
            buckets=[f * period_s for f in _BUDGET_FRACTIONS],
            registry=registry,
        )
        self.control_seconds, self.gather_seconds, self.scatter_seconds = (
            phases.labels(phase) for phase in ("control", "gather", "scatter")
        )
        self.tick_lateness_seconds = Histogram(
            "rtserve_lockstep_tick_lateness_seconds",
            "Tick start minus its deadline (jitter)",
            buckets=[f * period_s for f in _JITTER_FRACTIONS],
            registry=registry,
        )
        self.frame_budget_seconds = Gauge(
            "rtserve_lockstep_frame_budget_seconds", "Tick period: one frame of audio", registry=registry
        )
        self.total_slots = Gauge("rtserve_lockstep_slots", "Slots in the batch (capacity)", registry=registry)
        self.live_slots = Gauge("rtserve_lockstep_live_slots", "Slots stepped for a session", registry=registry)
        self.occupied_slots = Gauge(
            "rtserve_lockstep_occupied_slots", "Slots not free (prefill, live or draining)", registry=registry
        )
        self.standing_input_frames = Counter(
            "rtserve_lockstep_standing_input_frames",
            "Whole input frames still queued after a tick's take, summed over live slots and ticks: "
            "per live-slot tick, the frames of input latency above one tick",
            registry=registry,
        )
        self.drain_steps = Counter(
            "rtserve_lockstep_drain_steps",
            "Extra steps between two ticks that took one more frame from the live slots whose input "
            "waited, the other rows held (a DrainsInput model)",
            registry=registry,
        )
        self.drain_step_seconds = Histogram(
            "rtserve_lockstep_drain_step_seconds",
            "Wall time of one drain step: its input taken, the step of its rows, their outputs scattered",
            buckets=[f * period_s for f in _BUDGET_FRACTIONS],
            registry=registry,
        )
        self.drain_burst_frames = Histogram(
            "rtserve_lockstep_drain_burst_frames",
            "Frames one drain burst stepped (a model that steps a few rows several frames a call: "
            "Kyutai STT's flush rows); each frame also counts as a drain step",
            buckets=[1, 2, 3, 4, 6, 8, 12, 16],
            registry=registry,
        )
        self.drained_input_frames = Counter(
            "rtserve_lockstep_drained_input_frames",
            "Input frames taken by drain steps: standing input latency paid back",
            registry=registry,
        )
        self.underruns = Counter(
            "rtserve_lockstep_underruns", "Live-slot ticks stepped with silence for lack of input", registry=registry
        )
        self.dropped_input_frames = Counter(
            "rtserve_lockstep_dropped_input_frames",
            "Input dropped (oldest first) over the backlog bound (max_input_backlog_ms), in frames' worth of samples",
            registry=registry,
        )
        self.silence_stepped_seconds = Counter(
            "rtserve_lockstep_silence_stepped_seconds",
            "Silence stepped in place of input a live slot in cadence lacked at its tick: underruns' whole "
            "frames and the padding of partial frames (an underrun counts only frames with nothing at all)",
            registry=registry,
        )
        self.trimmed_input_samples = Counter(
            "rtserve_lockstep_trimmed_input_samples",
            "Quietest queued input samples dropped (drift_trim_ms a "
            "tick) because more than jitter_cushion_ms stood in the backlog through a whole trim window "
            "(jitter, clock drift or a burst: standing latency)",
            registry=registry,
        )
        self.dropped_output_frames = Counter(
            "rtserve_lockstep_dropped_output_frames",
            "Output frames dropped (oldest first) for a slow reader",
            registry=registry,
        )
        self.overruns = Counter(
            "rtserve_lockstep_overruns", "Ticks that took longer than the frame period", registry=registry
        )
        self.catch_up_ticks = Counter(
            "rtserve_lockstep_catch_up_ticks",
            "Ticks run back to back, without sleeping, because their "
            "deadline had passed (consuming input queued during an overrun)",
            registry=registry,
        )
        self.skipped_deadlines = Counter(
            "rtserve_lockstep_skipped_deadlines",
            "Tick deadlines given up for being more than "
            "max_input_backlog_ms behind (their input was dropped by the backlog bound)",
            registry=registry,
        )
        self.engine_failures = Counter(
            "rtserve_lockstep_engine_failures",
            "Model calls that raised (sessions involved were failed)",
            registry=registry,
        )
        self.frame_budget_seconds.set(period_s)
        self.total_slots.set(total_slots)
