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
import numpy.typing as npt

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.events import EngineFailure
from rtserve.engines.values import FrameOutput

_NEVER = np.iinfo(np.int64).max // 2  # takes since a miss, for a slot that never missed


class SlotPhase(enum.Enum):
    FREE = "free"  # no session; admission may take it
    PREFILL = "prefill"  # opened (or opening) and being conditioned; not stepped for a session yet
    LIVE = "live"  # stepped every tick: one input frame (or silence) in, one frame out
    DRAINING = "draining"  # released by its session; freed once the engine thread has forgotten it


class InputBacklogs:
    """Every slot's input samples, taken one tick-aligned frame at a time (docs/design.md#one-framing-owner).

    Transports push samples of any length into a slot (through its holder's ``InputBacklog``);
    each tick takes what arrived: a whole frame (oldest samples first) when there is one, else the
    partial frame padded with silence at its start, so the newest samples end at the tick (20 ms
    packets wait one packet, not a frame). Capped at ``limit`` samples per slot (at least a frame)
    by dropping the oldest: the cap is sized to hold what a stall of about a second leaves queued,
    so a stalled engine thread or event loop delays a user's audio instead of losing it; a push
    returns what went over it.

    With ``trim_window`` set it also absorbs jitter and clock drift. A late packet, a burst
    after a stall, or a client slightly faster than the engine leaves samples standing after
    every take; up to ``cushion`` samples may stand (a small jitter cushion). Samples standing
    above it through ``trim_window`` consecutive takes are pure added latency: from then on
    each take drops up to ``trim_samples`` of the quietest queued samples, until the backlog
    is back within the cushion (a late 80 ms packet costs a second or two of +80 ms, not
    the rest of the session).

    A slot whose audio misses a tick, comes on time, and misses again within ``late_window`` takes
    grows its cushion by what that miss stepped as silence (to a frame at most) and its debt is
    forgiven: the late audio stands as the cushion instead of being repaid. A stream whose packets
    reach the engine at the very edge of the tick misses it again and again otherwise: each miss
    stepped silence (a whole frame for 80 ms pages), the repay brought it back to the edge, and
    the next miss followed seconds later. The growth goes again once ``late_release`` takes in a
    row did not reach into it, and the trim window then takes the audio standing in it away.

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

    One table for all slots (one ``[slots, limit]`` buffer and per-slot state arrays) so that the
    engine thread takes a tick's frames of every live slot in one call (``take_frames``): the
    slots holding exactly one frame (a stream in cadence) or nothing (an underrun) are taken with
    a few array operations, the others one by one (``_take_locked``), with the same result.
    """

    def __init__(
        self,
        slots: int,
        frame_size: int,
        limit: int,
        trim_window: int | None = None,
        cushion: int = 0,
        trim_samples: int = 0,
        repay_samples: int = 0,
        late_window: int | None = None,
        late_release: int = 1,
    ) -> None:
        if frame_size < 1 or limit < frame_size:
            raise ValueError("frame size must be >= 1 and the input backlog limit at least one frame")
        if trim_window is not None and trim_window < 1:
            raise ValueError("trim window must be >= 1 frame")
        if cushion < 0:
            raise ValueError("the jitter cushion must be >= 0 samples")
        if late_window is not None and (late_window < 1 or late_release < 1):
            raise ValueError("the late-input window and release must be >= 1 take")
        self.frame_size = frame_size
        self.limit = limit  # samples per slot
        self.trim_window = trim_window
        self.cushion = cushion  # samples
        self.trim_samples = trim_samples
        self.repay_samples = repay_samples
        # Only where standing input is trimmed: without a trim window a late frame stands anyway.
        self.late_window = late_window if trim_window is not None else None
        self.late_release = late_release
        self._buf = np.zeros((slots, limit), np.float32)
        self._rows = list(self._buf)  # each slot's row, as a view: cheaper to index than the table
        self._size = [0] * slots  # a list: pushes (one per session per tick) read and write it
        # Silence stepped since the slot's backlog last stood within the cushion.
        self._silence_debt = np.zeros(slots, np.int64)
        self._in_cadence = np.zeros(slots, bool)  # a whole frame was on time: silence before that is no debt
        self._standing_takes = np.zeros(slots, np.int64)  # consecutive takes that left more than the cushion
        self._late_extra = np.zeros(slots, np.int64)  # samples the cushion grew by (``late_window``)
        self._since_miss = np.full(slots, _NEVER, np.int64)  # takes since the slot's audio last missed one
        self._late_extra_idle = np.zeros(slots, np.int64)  # consecutive takes that did not reach into it
        self._holder = [0] * slots  # bumped for each new holder: an old holder's calls do nothing
        self._lock = threading.Lock()

    def hold(self, slot: int) -> InputBacklog:
        """The slot's backlog, empty, for a new holder (a lease)."""
        with self._lock:
            self._holder[slot] += 1
            self._clear_locked(slot)
            return InputBacklog(self, slot, self._holder[slot])

    def take_frames(
        self, slots: npt.NDArray[np.intp], frames: FloatArray
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Write this tick's frame of each of ``slots`` into its row of ``frames``; return per slot
        (in ``slots``' order) the samples taken and trimmed, the whole frames it still holds
        after the take (input that waits more than a tick), and the silence stepped for a slot in
        cadence (what its frame lacked: an underrun's whole frame or a partial frame's padding).
        Nothing taken is an underrun: that row is left untouched for the caller to silence."""
        frame = self.frame_size
        with self._lock:
            sizes = np.array([self._size[slot] for slot in slots.tolist()], np.int64)
            in_cadence = self._in_cadence[slots]
            taken = np.minimum(sizes, frame)
            trimmed = np.zeros_like(sizes)
            # A whole frame and nothing left: in cadence, no debt, nothing standing.
            whole = slots[sizes == frame]
            if whole.size:
                frames[whole] = self._buf[whole, :frame]
                for slot in whole.tolist():
                    self._size[slot] = 0
                self._in_cadence[whole] = True
                self._silence_debt[whole] = 0
            # Nothing arrived: a stream in cadence owes the frame of silence stepped instead.
            empty = slots[sizes == 0]
            owing = empty[self._in_cadence[empty]]
            self._silence_debt[owing] = np.minimum(self.limit, self._silence_debt[owing] + frame)
            if self.trim_window is not None:
                self._standing_takes[whole] = 0
                self._standing_takes[empty] = 0
            for i in np.flatnonzero((sizes != frame) & (sizes != 0)).tolist():
                slot = int(slots[i])
                taken[i], trimmed[i] = self._take_locked(slot, frames[slot])
            missing = np.where(in_cadence, frame - taken, 0)
            if self.late_window is not None:
                self._follow_late_input_locked(slots, sizes, missing)
        return taken, trimmed, (sizes - taken - trimmed) // frame, missing

    def _follow_late_input_locked(
        self, slots: npt.NDArray[np.intp], sizes: npt.NDArray[np.int64], missing: npt.NDArray[np.int64]
    ) -> None:
        """After a take (``missing``: the silence each slot in cadence stepped): a slot that
        missed this tick, after audio on time since a miss less than ``late_window`` takes ago,
        grows its cushion to what it missed now (if more); one whose takes did not reach into the
        growth ``late_release`` times in a row loses it."""
        assert self.late_window is not None
        extra = self._late_extra[slots]
        since = self._since_miss[slots]
        missed = missing > 0
        missing = np.minimum(missing, max(0, self.frame_size - self.cushion))  # a cushion of a frame at most
        # A miss after audio that came on time, within the window of another: a stall's run of
        # misses is one late burst, repaid as such (``repay_samples``).
        grow = missed & (since > 0) & (since < self.late_window) & (missing > extra)
        self._late_extra[slots[grow]] = missing[grow]
        self._silence_debt[slots[grow]] = 0  # the late audio is the cushion now: none of it goes
        self._since_miss[slots] = np.where(missed, 0, np.minimum(since + 1, _NEVER))
        unneeded = (extra > 0) & ~grow & (sizes >= self.frame_size + extra)
        idle = np.where(unneeded, self._late_extra_idle[slots] + 1, 0)
        self._late_extra_idle[slots] = idle
        self._late_extra[slots[idle >= self.late_release]] = 0

    def _cushion_of(self, slot: int) -> int:
        return self.cushion + int(self._late_extra[slot])

    def _push(self, slot: int, holder: int, samples: FloatArray) -> int:
        overflow = max(0, samples.size - self.limit)  # a push longer than the cap keeps only its end
        if overflow:
            samples = samples[overflow:]
        with self._lock:
            if self._holder[slot] != holder:
                return 0
            size = self._size[slot]
            dropped = max(0, size + samples.size - self.limit)
            if dropped:
                self._shift_locked(slot, dropped)
                size -= dropped
            self._rows[slot][size : size + samples.size] = samples
            self._size[slot] = size + samples.size
        return overflow + dropped

    def _take(self, slot: int, holder: int, row: FloatArray) -> tuple[int, int]:
        with self._lock:
            if self._holder[slot] != holder:
                return 0, 0
            size, in_cadence = self._size[slot], bool(self._in_cadence[slot])
            taken, trimmed = self._take_locked(slot, row)
            if self.late_window is not None:
                missing = self.frame_size - taken if in_cadence else 0
                self._follow_late_input_locked(np.array([slot]), np.array([size]), np.array([missing]))
            return taken, trimmed

    def _take_locked(self, slot: int, row: FloatArray) -> tuple[int, int]:
        frame = self.frame_size
        taken = min(self._size[slot], frame)
        if taken:
            row[: frame - taken] = 0.0
            row[frame - taken :] = self._rows[slot][:taken]
            self._shift_locked(slot, taken)
        if taken == frame and self._size[slot] <= self._cushion_of(slot):
            self._in_cadence[slot] = True
            self._silence_debt[slot] = 0  # on time again: later bursts are the client's own
        elif self._in_cadence[slot]:  # a late packet, or every tick of a stall
            self._silence_debt[slot] = min(self.limit, int(self._silence_debt[slot]) + frame - taken)
        trimmed = self._trim_standing_latency_locked(slot) if self.trim_window is not None else 0
        return taken, trimmed

    def _shift_locked(self, slot: int, count: int) -> None:
        # numpy copes with the overlap; at most ``limit`` samples are moved per take.
        size = self._size[slot]
        buf = self._rows[slot]
        buf[: size - count] = buf[count:size]
        self._size[slot] = size - count

    def _trim_standing_latency_locked(self, slot: int) -> int:
        assert self.trim_window is not None
        excess = self._size[slot] - self._cushion_of(slot)
        if excess <= 0:
            self._standing_takes[slot] = 0
            return 0
        self._standing_takes[slot] += 1
        repay = min(self.repay_samples, int(self._silence_debt[slot]), excess)
        if repay:
            self._silence_debt[slot] -= repay
            self._drop_quietest_locked(slot, repay)
            return repay
        if self._standing_takes[slot] < self.trim_window:
            return 0
        count = min(self.trim_samples, excess)
        self._drop_quietest_locked(slot, count)
        return count

    def _drop_quietest_locked(self, slot: int, count: int) -> None:
        # The quietest run of ``count`` samples: dropping silence is inaudible.
        size = self._size[slot]
        buf = self._rows[slot]
        energy = np.concatenate(([0.0], np.cumsum(np.square(buf[:size], dtype=np.float64))))
        start = int(np.argmin(energy[count:] - energy[:-count]))
        buf[start : size - count] = buf[start + count : size]
        self._size[slot] = size - count

    def _clear(self, slot: int, holder: int) -> int:
        with self._lock:
            return self._clear_locked(slot) if self._holder[slot] == holder else 0

    def _clear_locked(self, slot: int) -> int:
        count = self._size[slot]
        self._size[slot] = 0
        self._standing_takes[slot] = 0
        self._silence_debt[slot] = 0
        self._in_cadence[slot] = False
        self._late_extra[slot] = 0
        self._since_miss[slot] = _NEVER
        self._late_extra_idle[slot] = 0
        return count

    def _len(self, slot: int, holder: int) -> int:
        return self._size[slot] if self._holder[slot] == holder else 0


class InputBacklog:
    """One holder's end of a slot's row of ``InputBacklogs`` (a lease's input). Once the slot has
    a new holder, this one's calls do nothing: a released lease cannot reach its successor's input."""

    def __init__(self, table: InputBacklogs, slot: int, holder: int) -> None:
        self._table = table
        self._slot = slot
        self._holder = holder
        self.limit = table.limit  # samples
        self.frame_size = table.frame_size

    def push(self, samples: FloatArray) -> int:
        """Queue float32 samples; return how many old samples were dropped to stay within the cap."""
        return self._table._push(self._slot, self._holder, samples)

    def take_into(self, row: FloatArray) -> tuple[int, int]:
        """Write this tick's frame into ``row``; return (samples taken, samples trimmed).

        Nothing taken is an underrun: ``row`` is left untouched for the caller to silence.
        """
        return self._table._take(self._slot, self._holder, row)

    def clear(self) -> int:
        """Drop everything queued; return how many samples that was."""
        return self._table._clear(self._slot, self._holder)

    def __len__(self) -> int:
        """Queued samples."""
        return self._table._len(self._slot, self._holder)


class OutputHandoff:
    """The one bounded hand-off of ``(frame, epoch)`` from the engine thread to the reader.

    When full, the oldest frame's audio is dropped (the reader fell behind; fresh audio
    matters more than stale audio) but never its text: a text piece is tiny and losing
    one garbles the transcript, so it is carried into the next frame of the same epoch, and
    so are the steps its words began at (``SpeechStep.word_starts``: their timestamps).
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
                starts = oldest.speech.word_starts if oldest.speech is not None else ()
                if oldest.text or starts:
                    following, following_epoch = self._items[0] if self._items else (output, epoch)
                    if following_epoch == oldest_epoch:  # older epochs' text is fenced off anyway
                        carried = _carry(oldest, following)
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
        return self.room > 0

    @property
    def room(self) -> int:
        """Frames that can be put before one pushes out an older one."""
        return self.limit - len(self._items)

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


def _carry(dropped: FrameOutput, following: FrameOutput) -> FrameOutput:
    """``following`` with the text and word starts of the frame dropped before it."""
    carried = replace(following, text=(dropped.text or "") + (following.text or "") or None)
    if dropped.speech is not None and following.speech is not None:
        starts = dropped.speech.word_starts + following.speech.word_starts
        carried = replace(carried, speech=replace(following.speech, word_starts=starts))
    return carried
