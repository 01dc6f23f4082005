"""A recording FrameModel for scheduler tests (the model seam's test double)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.errors import CapacityExhausted
from rtserve.engines.lockstep import LockstepScheduler, SlotLease
from rtserve.engines.values import FrameOutput, SlotPrompt
from tests.clocks import FakeTickClock

FRAME = 8  # samples per frame of the fake models
PERIOD = 0.08  # seconds per frame of the fake models (8 samples at 100 Hz)


class RecordingModel:
    """Echoes each live row's input frame; records every call and flags calls made mid-step.

    ``open_slot`` asks for ``len(prompt.text)`` prefill steps, so tests choose prefill length
    through the prompt. ``step_hook(step_index)`` runs inside ``step`` (simulated work, or an
    event racing the step).
    """

    def __init__(self, batch_size: int = 4, frame_size: int = FRAME, sample_rate: int = 100) -> None:
        self.batch_size = batch_size
        self.frame_size = frame_size
        self.sample_rate = sample_rate
        self.output_delay_frames = 0
        self.calls: list[tuple] = []
        self.violations: list[str] = []
        self.steps = 0
        self.step_hook: Callable[[int], None] | None = None
        self.fail_open_for: set[int] = set()
        self.refuse_open_for: set[int] = set()
        self.fail_next_step = False
        self._prefill_left: dict[int, int] = {}
        self._in_step = False
        self._lock = threading.Lock()

    def _record(self, *call: object) -> None:
        with self._lock:
            if self._in_step:
                self.violations.append(f"{call[0]} during step")
            self.calls.append(call)

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        self._record("open", slot)
        if slot in self.fail_open_for:
            raise RuntimeError("open failed")
        if slot in self.refuse_open_for:
            raise CapacityExhausted("no KV memory for this slot")
        self._prefill_left[slot] = len(prompt.text or "")
        return self._prefill_left[slot]

    def prefill_step(self, slot: int) -> bool:
        self._record("prefill", slot)
        self._prefill_left[slot] -= 1
        return self._prefill_left[slot] <= 0

    def step(self, frames: np.ndarray, live: np.ndarray) -> list[FrameOutput | None]:
        self._record("step", tuple(int(i) for i in np.flatnonzero(live)))
        self._in_step = True
        try:
            index = self.steps
            self.steps += 1
            if self.step_hook is not None:
                self.step_hook(index)
            if self.fail_next_step:
                self.fail_next_step = False
                raise RuntimeError("step failed")
            return [FrameOutput(frames[i].copy(), text=str(index)) if live[i] else None for i in range(self.batch_size)]
        finally:
            self._in_step = False

    def release(self, slot: int) -> None:
        self._record("release", slot)


def frame(value: float, size: int = FRAME) -> np.ndarray:
    return np.full(size, value, np.float32)


def make_scheduler(
    model: RecordingModel | None = None, **config: object
) -> tuple[LockstepScheduler, RecordingModel, CollectorRegistry]:
    model = model or RecordingModel()
    registry = CollectorRegistry()
    return LockstepScheduler(model, LockstepConfig(**config), registry), model, registry


def metric(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    return 0.0 if value is None else value


class ClientFeedingClock(FakeTickClock):
    """Fake time that also plays a real-time client: frame k (value k + 1) is sent at
    (k + ``phase``) periods and delivered, in order, whenever time moves past it (plus
    ``late[k]`` seconds of network delay for the frames named there), whatever the engine does."""

    def __init__(self, late: dict[int, float] | None = None, phase: float = 0.5) -> None:
        super().__init__()
        self._phase = phase
        self.lease: SlotLease | None = None
        self.arrivals: list[float] = []  # send time of each delivered frame
        self._late = late or {}

    def sleep_until(self, deadline: float) -> None:
        super().sleep_until(deadline)
        self._deliver()

    def advance(self, seconds: float) -> None:
        super().advance(seconds)
        self._deliver()

    def _deliver(self) -> None:
        now = self.monotonic()
        while self.lease is not None:
            k = len(self.arrivals)
            sent = (k + self._phase) * PERIOD
            if sent + self._late.get(k, 0.0) > now:
                return
            self.arrivals.append(sent)
            self.lease.push_samples(frame(float(k + 1)))
