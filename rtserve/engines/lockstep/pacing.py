"""Drift-free tick pacing with bounded catch-up, on an injectable clock.

Tick ``n`` is due at ``start + n * period``, computed from ``n`` (never by adding
periods up, so rounding cannot accumulate).

Why catch up instead of skipping missed deadlines: clients keep sending one frame per
period whatever the engine does, so every deadline the engine misses leaves one more
input frame queued per live session. Skipping those deadlines would keep the frames
queued for good: each overrun would add a frame period of latency until the input
backlog cap started dropping audio. So when a tick ends past the next deadline, the
missed ticks run back to back, without sleeping; each consumes a frame the clients
already sent, and once the schedule is back on its grid the input latency is what it
was before the overrun.

Catch-up is bounded: the pacer never stays more than ``max_behind`` deadlines (the
input backlog cap) behind the current time. Frames older than that were already
dropped by the backlog cap, so their ticks could only step silence, and an overloaded
engine chasing an ever-growing debt would never recover; deadlines further behind are
skipped (and counted).

Each finished tick yields a ``TickOutcome``: how late it started, how long it took
(an *overrun* is a tick that took longer than the period), whether it was a catch-up
tick, and how many deadlines it left behind or skipped. Counting and logging are the
caller's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

# A tick ending within this fraction of a period after a deadline has not missed it:
# float rounding of ``start + n * period`` must not turn an on-time tick into a catch-up.
_DEADLINE_TOLERANCE = 1e-6


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


@dataclass(frozen=True)
class TickOutcome:
    """How one finished tick fared against the schedule."""

    index: int  # deadline number since the last ``restart``
    deadline: float
    started: float
    duration_s: float  # from the end of ``wait`` to ``finish``
    overrun_s: float  # how much longer than one period the tick took; 0 within budget
    catch_up: bool  # its deadline had passed when the previous tick ended: it ran without sleeping
    behind: int  # deadlines already passed when it ended, still to run back to back (<= max_behind)
    skipped: int  # deadlines given up when it ended: more than max_behind behind

    @property
    def lateness_s(self) -> float:
        return self.started - self.deadline


class TickPacer:
    def __init__(self, clock: TickClock, period_s: float, max_behind: int) -> None:
        if period_s <= 0:
            raise ValueError("tick period must be positive")
        if max_behind < 1:
            raise ValueError("max_behind must be >= 1")
        self.clock = clock
        self.period_s = period_s
        self.max_behind = max_behind
        self._start = clock.monotonic()
        self._index = 0
        self._started = self._start
        self._catch_up = False

    @property
    def index(self) -> int:
        """Number of the current tick's deadline since the last ``restart``."""
        return self._index

    def deadline(self, index: int | None = None) -> float:
        return self._start + (self._index if index is None else index) * self.period_s

    def restart(self, first_in_s: float = 0.0) -> None:
        """Begin a new schedule (after idling: the first tick is due at once; after a tick run
        ahead of the schedule: a period later)."""
        self._start = self.clock.monotonic() + first_in_s
        self._index = 0
        self._catch_up = False

    def wait(self) -> float:
        """Sleep until the current tick's deadline (not at all when catching up); return it."""
        due = self.deadline()
        self.clock.sleep_until(due)
        self._started = self.clock.monotonic()
        return due

    def finish(self) -> TickOutcome:
        """Called when the tick's work is done: measure it and pick the next deadline."""
        now = self.clock.monotonic()
        index = self._index
        # The newest deadline strictly before ``now``; deadlines index+1 .. last_passed were missed.
        last_passed = math.ceil((now - self._start) / self.period_s - _DEADLINE_TOLERANCE) - 1
        missed = max(0, last_passed - index)
        skipped = max(0, missed - self.max_behind)
        duration_s = now - self._started
        outcome = TickOutcome(
            index=index,
            deadline=self.deadline(index),
            started=self._started,
            duration_s=duration_s,
            overrun_s=max(0.0, duration_s - self.period_s),
            catch_up=self._catch_up,
            behind=missed - skipped,
            skipped=skipped,
        )
        self._index = index + 1 + skipped
        self._catch_up = missed > skipped
        return outcome
