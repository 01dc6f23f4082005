"""Drift-free tick pacing for the engine thread, on an injectable clock.

Tick ``n`` is due at ``start + n * period``, computed from ``n`` (never by adding
periods up, so rounding cannot accumulate). A tick that ends past the next deadline is
an overrun: the pacer skips to the first deadline still in the future instead of
bursting to catch up, so an overrun costs frames, never added latency.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Protocol


class TickClock(Protocol):
    """Thread-side time: the engine thread blocks in ``sleep_until``."""

    def monotonic(self) -> float: ...

    def sleep_until(self, deadline: float) -> None: ...


class SystemTickClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class FakeTickClock:
    """Virtual time: ``sleep_until`` jumps to the deadline, ``advance`` simulates work."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep_until(self, deadline: float) -> None:
        with self._lock:
            self._now = max(self._now, deadline)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@dataclass(frozen=True)
class TickOutcome:
    """How a finished tick fared against the next deadline."""

    overrun_s: float  # how far past the next deadline the tick ended; 0 when on time
    skipped: int  # deadlines given up because of the overrun


class TickPacer:
    def __init__(self, clock: TickClock, period_s: float) -> None:
        if period_s <= 0:
            raise ValueError("tick period must be positive")
        self.clock = clock
        self.period_s = period_s
        self._start = clock.monotonic()
        self._index = 0

    @property
    def index(self) -> int:
        """Number of the current tick's deadline since the last ``restart``."""
        return self._index

    def deadline(self, index: int | None = None) -> float:
        return self._start + (self._index if index is None else index) * self.period_s

    def restart(self) -> None:
        """Begin a new schedule now (after idling): the first tick is due at once."""
        self._start = self.clock.monotonic()
        self._index = 0

    def wait(self) -> float:
        """Sleep until the current tick's deadline; return that deadline."""
        due = self.deadline()
        self.clock.sleep_until(due)
        return due

    def finish(self) -> TickOutcome:
        """Called when the tick's work is done: pick the next deadline."""
        now = self.clock.monotonic()
        following = self._index + 1
        next_due = self.deadline(following)
        if now <= next_due:
            self._index = following
            return TickOutcome(0.0, 0)
        # First deadline strictly after ``now``; never earlier than ``following + 1``.
        upcoming = max(following + 1, math.floor((now - self._start) / self.period_s) + 1)
        self._index = upcoming
        return TickOutcome(now - next_due, upcoming - following)
