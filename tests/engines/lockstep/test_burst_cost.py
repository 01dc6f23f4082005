"""``BurstCost``: a drain burst's size from a fitted cost (fixed + a frame), not its last cost a frame."""

from __future__ import annotations

import sys

from rtserve.engines.lockstep.burst_cost import BurstCost


def test_before_any_burst_the_given_cost_a_frame_sizes_it() -> None:
    assert BurstCost().frames_within(0.060, 1.5, 0.010) == 4  # 40 ms of room / 10 ms a frame


def test_one_burst_size_seen_counts_all_its_cost_a_frame() -> None:
    cost = BurstCost()
    cost.observe(2, 0.020)
    assert cost.fitted() == (0.0, 0.010)
    assert cost.frames_within(0.060, 1.5, 0.001) == 4


def test_a_burst_with_a_large_fixed_part_does_not_keep_the_next_at_one_frame() -> None:
    """Copies of 20 ms a burst and 2 ms a frame: sized by the last one's cost a frame, a burst of
    one frame (22 ms) leaves room for one frame again in 45 ms; fitted, eight."""
    cost = BurstCost()
    cost.observe(1, 0.022)
    cost.observe(4, 0.028)
    fixed_s, frame_s = cost.fitted() or (0.0, 0.0)
    assert round(fixed_s, 6) == 0.020 and round(frame_s, 6) == 0.002
    assert cost.frames_within(0.045, 1.5, 0.010) == 5  # (30 - 20) / 2
    cost.observe(1, 0.022)  # the latest burst of one frame again: the fit stands
    assert cost.frames_within(0.045, 1.5, 0.010) == 5


def test_noisy_durations_never_make_a_frame_free() -> None:
    cost = BurstCost()
    cost.observe(1, 0.030)
    cost.observe(8, 0.029)  # a faster burst of more frames: the GPU was busier for the first
    fixed_s, frame_s = cost.fitted() or (0.0, 0.0)
    assert frame_s >= 0.25 * 0.029 / 8 and fixed_s >= 0.0
    assert cost.frames_within(0.060, 1.5, 0.010) < 40


def test_sizes_not_seen_for_a_while_drop_out() -> None:
    cost = BurstCost()
    cost.observe(16, 0.100)
    for frames in range(1, 9):
        cost.observe(frames, 0.010 + 0.002 * frames)
    fixed_s, frame_s = cost.fitted() or (0.0, 0.0)
    assert (round(fixed_s, 6), round(frame_s, 6)) == (0.010, 0.002)  # the old 16-frame burst is gone


def test_a_clock_that_stands_still_bounds_nothing() -> None:
    cost = BurstCost()
    cost.observe(3, 0.0)
    assert cost.frames_within(0.010, 1.5, 0.0) == sys.maxsize
