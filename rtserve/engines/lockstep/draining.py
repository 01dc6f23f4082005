"""What drain steps may take, slot by slot (docs/engines.md#draining-waiting-input).

A model that never drops input (Kyutai STT) gets two things from its scheduler beside the paced
ticks, both paid back by drain steps (steps between ticks that advance only some rows):

* **Standing input.** Whole frames still queued after a tick's take are latency for good. Once
  they have stood ``after_ticks`` takes in a row they are due: a frame standing once may be a
  client's frames arriving about when the tick takes them, and taking it would leave a later
  tick with nothing.
* **Late input.** A live slot with nothing to take at a tick is held, not stepped on silence,
  for up to ``grace_ticks`` ticks in a row: no silence is written into the stream, and the
  slot is owed a step per tick held. A later tick takes the late frame; if frames then stand
  behind it, drain steps take them at once (without waiting ``after_ticks``). A take that
  leaves nothing standing settles the debt: the slot is back in cadence. A slot that stays quiet
  longer than the grace is idle: it steps on silence again and owes nothing.
* **Flushed input.** A stream that wants its model's delay stepped now (the end of a turn:
  silence appended so the last words come out) names the frames it queued; drain steps take
  them, and whatever stands before them, as soon as a tick leaves room, up to what stands.

The ledger is the engine thread's only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class DrainLedger:
    def __init__(self, slots: int, after_ticks: int, grace_ticks: int) -> None:
        if after_ticks < 1:
            raise ValueError("drain_after_ticks must be >= 1")
        if grace_ticks < 0:
            raise ValueError("late_input_grace_ticks must be >= 0")
        self.after_ticks = after_ticks
        self.grace_ticks = grace_ticks
        self._standing_takes = np.zeros(slots, np.int64)  # takes in a row that left frames standing
        self._empty_takes = np.zeros(slots, np.int64)  # takes in a row that found nothing
        self._due = np.zeros(slots, np.int64)  # standing frames drain steps may take after this tick
        self._owed = np.zeros(slots, np.int64)  # steps a held slot missed
        self._flushed = np.zeros(slots, np.int64)  # frames a stream asked to be stepped now

    def after_take(
        self, slots: npt.NDArray[np.intp], taken: npt.NDArray[np.int64], standing: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """After a paced tick's take of the live ``slots``: plan the drain steps, and return which of
        ``slots`` (in their order) the tick holds rather than steps on silence."""
        live = np.zeros(self._owed.size, bool)
        live[slots] = True
        for counter in (self._standing_takes, self._empty_takes, self._owed, self._flushed):
            counter[~live] = 0  # a slot not live now starts afresh when it is
        # The tick took a frame of what was flushed, or one before it: no more than stands now.
        self._flushed[slots] = np.minimum(self._flushed[slots], standing)
        standing_takes = np.where(standing > 0, self._standing_takes[slots] + 1, 0)
        self._standing_takes[slots] = standing_takes
        self._due[:] = 0
        due = standing_takes >= self.after_ticks
        self._due[slots[due]] = standing[due]
        empty = np.where(taken == 0, self._empty_takes[slots] + 1, 0)
        self._empty_takes[slots] = empty
        held = (empty > 0) & (empty <= self.grace_ticks)
        self._owed[slots[held]] += 1
        self._owed[slots[empty > self.grace_ticks]] = 0  # idle: it steps on silence, owes nothing
        self._owed[slots[(taken > 0) & (standing == 0)]] = 0  # in cadence again
        return held

    def flush(self, slot: int, frames: int) -> None:
        """``slot``'s stream queued ``frames`` (the last of its input) to be stepped without waiting
        for their ticks."""
        self._flushed[slot] += frames

    def wants(self, slot: int) -> bool:
        """A drain step may take a frame of ``slot`` (if it has a whole one)."""
        return bool(self._owed[slot] or self._due[slot] or self._flushed[slot])

    def flushing(self, slot: int) -> bool:
        """``slot``'s stream asked for frames to be stepped now that drain steps have not taken yet."""
        return bool(self._flushed[slot])

    def wanted(self, slot: int) -> int:
        """How many frames of ``slot`` drain steps may take (as many as it has whole)."""
        return int(self._owed[slot] + self._flushed[slot] + self._due[slot])

    def spend(self, slot: int) -> None:
        """A drain step took a frame of ``slot``: a missed step first, then a flushed or standing frame."""
        if self._owed[slot]:
            self._owed[slot] -= 1
        elif self._flushed[slot]:
            self._flushed[slot] -= 1
        else:
            self._due[slot] -= 1

    def settle(self) -> None:
        """No slot that is owed, due or flushed has a frame now: standing frames wait for the next
        tick's plan (a held slot's owed steps stay owed until its late frame comes)."""
        self._due[:] = 0
        self._flushed[:] = 0
