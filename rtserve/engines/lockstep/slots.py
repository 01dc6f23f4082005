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
from dataclasses import replace
from operator import attrgetter
from typing import Protocol

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.events import EngineFailure
from rtserve.engines.values import FrameOutput


class SlotPhase(enum.Enum):
    FREE = "free"  # no session; admission may take it
    PREFILL = "prefill"  # opened (or opening) and being conditioned; not stepped for a session yet
    LIVE = "live"  # stepped every tick: one input frame (or silence) in, one frame out
    DRAINING = "draining"  # released by its session; freed once the engine thread has forgotten it


class InputBacklog:
    """Per-slot input samples, taken one tick-aligned frame at a time (docs/design.md#one-framing-owner).

    Transports push samples of any length; each tick ``take_into`` takes what arrived: a
    whole frame (oldest samples first) when there is one, else the partial frame padded
    with silence at its start, so the newest samples end at the tick (20 ms packets wait
    one packet, not a frame). Capped at ``limit`` samples (at least a frame) by dropping the
    oldest: the cap is sized to hold what a stall of about a second leaves queued, so a stalled
    engine thread or event loop delays a user's audio instead of losing it; ``push`` returns what
    went over it.

    With ``trim_window`` set it also absorbs jitter and clock drift. A late packet, a burst
    after a stall, or a client slightly faster than the engine leaves samples standing after
    every take; up to ``cushion`` samples may stand (a small jitter cushion). Samples standing
    above it through ``trim_window`` consecutive takes are pure added latency: from then on
    each take drops up to ``trim_samples`` of the quietest queued samples, until the backlog
    is back within the cushion (a late 80 ms packet costs a second or two of +80 ms, not
    the rest of the session).

    Silence the backlog itself stepped (an underrun, or a partial frame's padding) is a debt:
    when the late audio then stands above the cushion it is latency the server added, not the
    client's drift, so up to ``repay_samples`` of the quietest queued samples go at every tick
    at once, without waiting out the window, until the debt is repaid or the backlog is back
    within the cushion (a packet a few ms late then costs a few ticks of extra latency; a burst
    after a stall of the event loop, whose every tick stepped silence, is repaid the same way, at
    ``repay_samples`` a tick). Debt starts once a whole frame was taken on time (silence before a
    stream's first audio is no debt), is capped at the backlog limit, and is cleared by the next
    such take: a client pause followed by an on-time stream leaves none, later bursts are the
    client's own.
    """

    def __init__(
        self,
        frame_size: int,
        limit: int,
        trim_window: int | None = None,
        cushion: int = 0,
        trim_samples: int = 0,
        repay_samples: int = 0,
    ) -> None:
        if frame_size < 1 or limit < frame_size:
            raise ValueError("frame size must be >= 1 and the input backlog limit at least one frame")
        if trim_window is not None and trim_window < 1:
            raise ValueError("trim window must be >= 1 frame")
        self.frame_size = frame_size
        self.limit = limit  # samples
        self.trim_window = trim_window
        self.cushion = cushion  # samples
        self.trim_samples = trim_samples
        self.repay_samples = repay_samples
        self._silence_debt = 0  # silence stepped since the backlog last stood within the cushion
        self._in_cadence = False  # a whole frame was on time: silence before that is no debt
        self._buf = np.zeros(self.limit, np.float32)
        self._size = 0
        self._lock = threading.Lock()
        self._standing_takes = 0  # consecutive takes that left more than the cushion standing

    def push(self, samples: FloatArray) -> int:
        """Queue float32 samples; return how many old samples were dropped to stay within the cap."""
        overflow = max(0, samples.size - self.limit)  # a push longer than the cap keeps only its end
        samples = samples[overflow:]
        with self._lock:
            dropped = max(0, self._size + samples.size - self.limit)
            if dropped:
                self._shift_locked(dropped)
            self._buf[self._size : self._size + samples.size] = samples
            self._size += samples.size
        return overflow + dropped

    def take_into(self, row: FloatArray) -> tuple[int, int]:
        """Write this tick's frame into ``row``; return (samples taken, samples trimmed).

        Nothing taken is an underrun: ``row`` is left untouched for the caller to silence.
        """
        frame = self.frame_size
        with self._lock:
            taken = min(self._size, frame)
            if taken:
                row[: frame - taken] = 0.0
                row[frame - taken :] = self._buf[:taken]
                self._shift_locked(taken)
            if taken == frame and self._size <= self.cushion:
                self._in_cadence = True
                self._silence_debt = 0  # on time again: later bursts are the client's own
            elif self._in_cadence:  # a late packet, or every tick of a stall
                self._silence_debt = min(self.limit, self._silence_debt + frame - taken)
            trimmed = self._trim_standing_latency_locked() if self.trim_window is not None else 0
        return taken, trimmed

    def _shift_locked(self, count: int) -> None:
        # numpy copes with the overlap; at most ``limit`` samples are moved per take.
        self._buf[: self._size - count] = self._buf[count : self._size]
        self._size -= count

    def _trim_standing_latency_locked(self) -> int:
        assert self.trim_window is not None
        excess = self._size - self.cushion
        if excess <= 0:
            self._standing_takes = 0
            return 0
        self._standing_takes += 1
        repay = min(self.repay_samples, self._silence_debt, excess)
        if repay:
            self._silence_debt -= repay
            self._drop_quietest_locked(repay)
            return repay
        if self._standing_takes < self.trim_window:
            return 0
        count = min(self.trim_samples, excess)
        self._drop_quietest_locked(count)
        return count

    def _drop_quietest_locked(self, count: int) -> None:
        # The quietest run of ``count`` samples: dropping silence is inaudible.
        energy = np.concatenate(([0.0], np.cumsum(np.square(self._buf[: self._size], dtype=np.float64))))
        start = int(np.argmin(energy[count:] - energy[:-count]))
        self._buf[start : self._size - count] = self._buf[start + count : self._size]
        self._size -= count

    def clear(self) -> int:
        """Drop everything queued; return how many samples that was."""
        with self._lock:
            count = self._size
            self._size = 0
            self._standing_takes = 0
            self._silence_debt = 0
            self._in_cadence = False
        return count

    def __len__(self) -> int:
        """Queued samples."""
        return self._size


class OutputHandoff:
    """The one bounded hand-off of ``(frame, epoch)`` from the engine thread to the reader.

    When full, the oldest frame's audio is dropped (the reader fell behind; fresh audio
    matters more than stale audio) but never its text: a text piece is tiny and losing
    one garbles the transcript, so it is carried into the next frame of the same epoch.
    Closing discards what is queued: a released slot's pending output must never be
    delivered.
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
        """Queue one frame; True when the oldest queued frame's audio was dropped to make room."""
        with self._lock:
            if self.closed:
                return False
            dropped = len(self._items) >= self.limit
            if dropped:
                oldest, oldest_epoch = self._items.popleft()
                if oldest.text:
                    following, following_epoch = self._items[0] if self._items else (output, epoch)
                    if following_epoch == oldest_epoch:  # older epochs' text is fenced off anyway
                        carried = replace(following, text=oldest.text + (following.text or ""))
                        if self._items:
                            self._items[0] = (carried, following_epoch)
                        else:
                            output = carried
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

    @property
    def has_room(self) -> bool:
        """A frame put now would not push out an older one."""
        return len(self._items) < self.limit

    def __len__(self) -> int:
        return len(self._items)


class Wakeable(Protocol):
    # Targets of one wake-up are woken in ascending order (a lease's: when the newest input its
    # last tick stepped arrived, so the session whose input waited longest is served first).
    wake_order: float

    def wake(self) -> None:
        """Runs on the event loop: tell loop-side waiters that something changed."""
        ...


class LoopNotifier:
    """Coalesced engine-thread -> event-loop wake-ups.

    The engine thread marks targets dirty; each loop gets at most one pending
    ``call_soon_threadsafe`` callback, which runs ``target.wake()`` for every dirty
    target on that loop, in ``wake_order``. A stalled loop therefore costs one pending callback and a set
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
        for target in sorted(dirty, key=attrgetter("wake_order")):
            target.wake()
