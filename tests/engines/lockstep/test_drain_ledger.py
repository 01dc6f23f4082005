"""``DrainLedger``: which slots a drain step may take a frame from, tick by tick."""

from __future__ import annotations

import numpy as np
import pytest

from rtserve.engines.lockstep.draining import DrainLedger

SLOT = np.array([0], np.intp)


def _take(ledger: DrainLedger, taken: int, standing: int) -> bool:
    """One paced take of slot 0; whether the tick holds it."""
    return bool(ledger.after_take(SLOT, np.array([taken], np.int64), np.array([standing], np.int64))[0])


def test_standing_input_is_due_only_once_it_stood_after_ticks_takes_in_a_row() -> None:
    ledger = DrainLedger(2, after_ticks=3, grace_ticks=0)
    for _ in range(2):
        _take(ledger, 8, 1)
        assert not ledger.wants(0)
    _take(ledger, 8, 2)
    assert ledger.wants(0)
    ledger.spend(0)
    ledger.spend(0)
    assert not ledger.wants(0)  # both standing frames taken
    _take(ledger, 8, 0)
    _take(ledger, 8, 1)  # the count starts again after a take with nothing standing
    assert not ledger.wants(0)


def test_a_late_slot_is_held_for_the_grace_then_steps_silence_owing_nothing() -> None:
    ledger = DrainLedger(1, after_ticks=12, grace_ticks=2)
    assert _take(ledger, 0, 0) and _take(ledger, 0, 0)
    assert ledger.wants(0)  # owed: its late frames get drain steps when they come
    assert not _take(ledger, 0, 0)  # quiet past the grace: idle, stepped on silence
    assert not ledger.wants(0)


@pytest.mark.parametrize(("standing", "owed"), [(0, False), (1, True)])
def test_a_take_after_a_held_tick_settles_the_debt_unless_frames_stand(standing: int, owed: bool) -> None:
    """Held once, then the late frame is taken: with nothing behind it the slot is in cadence again
    (draining an on-time frame would only leave the next tick without one); with a frame standing
    behind it, that frame is due at once."""
    ledger = DrainLedger(1, after_ticks=12, grace_ticks=2)
    assert _take(ledger, 0, 0)
    assert not _take(ledger, 8, standing)
    assert ledger.wants(0) is owed


def test_a_slot_that_is_not_live_starts_afresh() -> None:
    ledger = DrainLedger(2, after_ticks=1, grace_ticks=2)
    _take(ledger, 0, 0)
    ledger.after_take(np.array([1], np.intp), np.array([8], np.int64), np.array([0], np.int64))  # slot 0 released
    assert not ledger.wants(0)


def test_flushed_frames_are_wanted_at_once_up_to_what_stands() -> None:
    """A stream flushing its model's delay: its queued frames go to drain steps without waiting
    ``after_ticks`` takes; a paced take in between leaves no more wanted than still stands."""
    ledger = DrainLedger(1, after_ticks=12, grace_ticks=2)
    _take(ledger, 8, 0)
    ledger.flush(0, 7)
    assert ledger.wants(0)
    _take(ledger, 8, 3)  # the tick took one; three stand (the rest were never queued)
    assert ledger.wanted(0) == 3 and ledger.flushing(0)  # a burst may take all three at once
    for _ in range(3):
        assert ledger.wants(0)
        ledger.spend(0)
    assert not ledger.wants(0) and ledger.wanted(0) == 0 and not ledger.flushing(0)
    ledger.flush(0, 2)
    ledger.settle()  # no frame left to take: the flush is spent
    assert not ledger.wants(0)
