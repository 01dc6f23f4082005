"""Slot-table building blocks shared by the engine thread and the event loop.

Everything here is touched from two threads: the asyncio loop (sessions push input,
fence epochs, read outputs) and the one engine thread (pops input, hands outputs
over). Each structure guards itself with a short lock; nothing here ever blocks for
longer than a deque operation.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections import deque
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from rtserve.engines.protocols import EngineFailure, FrameOutput


class SlotPhase(enum.Enum):
    FREE = "free"  # no session; admission may take it
    PREFILL = "prefill"  # opened (or opening) and being conditioned; not stepped for a session yet
    LIVE = "live"  # stepped every tick: one input frame (or silence) in, one frame out
    DRAINING = "draining"  # released by its session; freed once the engine thread has forgotten it


class InputBacklog:
    """Per-slot queue of whole input frames, capped by dropping the oldest.

    With ``trim_window`` set it is also an adaptive jitter buffer. A frame that arrives
    just after its tick leaves the slot one frame behind for good: from then on a frame
    is still queued after every pop. ``keep_spare`` such frames are kept as a cushion
    against network jitter (a slot that has one never underruns on a late frame); when
    more than that stayed queued through a whole window of ``trim_window`` pops, they are
    pure added latency and the quietest queued frame is dropped.
    """

    def __init__(self, limit: int, trim_window: int | None = None, keep_spare: int = 0) -> None:
        if limit < 1:
            raise ValueError("input backlog limit must be >= 1")
        if trim_window is not None and trim_window < 1:
            raise ValueError("trim window must be >= 1 frame")
        self.limit = limit
        self.trim_window = trim_window
        self.keep_spare = keep_spare
        self.trimmed = 0  # frames dropped to cut standing latency; written by the engine thread only
        self._frames: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self._window_pops = 0
        self._window_min = limit

    def push(self, frames: Iterable[np.ndarray]) -> int:
        """Queue frames; return how many old frames were dropped to stay within the cap."""
        dropped = 0
        with self._lock:
            for frame in frames:
                if len(self._frames) >= self.limit:
                    self._frames.popleft()
                    dropped += 1
                self._frames.append(frame)
        return dropped

    def pop(self) -> tuple[np.ndarray | None, bool]:
        """The next frame (None on underrun), and whether a standing frame was trimmed."""
        with self._lock:
            frame = self._frames.popleft() if self._frames else None
            trimmed = self.trim_window is not None and self._trim_standing_latency_locked()
        return frame, trimmed

    def _trim_standing_latency_locked(self) -> bool:
        self._window_min = min(self._window_min, len(self._frames))
        self._window_pops += 1
        if self._window_pops < self.trim_window:
            return False
        standing = self._window_min
        self._window_pops, self._window_min = 0, self.limit
        if standing <= self.keep_spare:
            return False
        quietest = min(range(len(self._frames)), key=lambda i: float(np.dot(self._frames[i], self._frames[i])))
        del self._frames[quietest]
        self.trimmed += 1
        return True

    def clear(self) -> int:
        with self._lock:
            count = len(self._frames)
            self._frames.clear()
            self._window_pops, self._window_min = 0, self.limit
        return count

    def __len__(self) -> int:
        return len(self._frames)


class OutputHandoff:
    """Bounded per-slot hand-off of ``(frame, epoch)`` from the engine thread to the loop.

    When full, the oldest frame is dropped (the reader fell behind; fresh audio matters
    more than stale audio). Closing discards what is queued: a released slot's pending
    output must never be delivered.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("output queue limit must be >= 1")
        self.limit = limit
        self._items: deque[tuple[FrameOutput, int]] = deque()
        self._lock = threading.Lock()
        self.closed = False
        self.failure: EngineFailure | None = None

    def put(self, output: FrameOutput, epoch: int) -> bool:
        """Queue one frame; True when the oldest queued frame was dropped to make room."""
        with self._lock:
            if self.closed:
                return False
            dropped = len(self._items) >= self.limit
            if dropped:
                self._items.popleft()
            self._items.append((output, epoch))
        return dropped

    def pop(self) -> tuple[FrameOutput, int] | None:
        with self._lock:
            return self._items.popleft() if self._items else None

    def purge_before(self, epoch: int) -> int:
        """Drop every queued frame stamped with an epoch older than ``epoch``."""
        with self._lock:
            kept = deque(item for item in self._items if item[1] >= epoch)
            purged = len(self._items) - len(kept)
            self._items = kept
        return purged

    def close(self, failure: EngineFailure | None = None) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.failure = failure
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class Wakeable(Protocol):
    def wake(self) -> None:
        """Runs on the event loop: tell loop-side waiters that something changed."""
        ...


class LoopNotifier:
    """Coalesced engine-thread -> event-loop wake-ups.

    The engine thread marks targets dirty; each loop gets at most one pending
    ``call_soon_threadsafe`` callback, which runs ``target.wake()`` for every dirty
    target on that loop. A stalled loop therefore costs one pending callback and a set
    of targets, never an ever-growing callback queue.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, set[Wakeable]] = {}

    def notify(self, targets: Iterable[tuple[asyncio.AbstractEventLoop, Wakeable]]) -> None:
        to_schedule: list[asyncio.AbstractEventLoop] = []
        with self._lock:
            for loop, target in targets:
                dirty = self._pending.get(loop)
                if dirty is None:
                    self._pending[loop] = {target}
                    to_schedule.append(loop)
                else:
                    dirty.add(target)
        for loop in to_schedule:
            try:
                loop.call_soon_threadsafe(self._flush, loop)
            except RuntimeError:  # the loop is closed: nobody is left to wake
                with self._lock:
                    self._pending.pop(loop, None)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            dirty = self._pending.pop(loop, set())
        for target in dirty:
            target.wake()
