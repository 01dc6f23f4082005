"""What a drain burst costs, and so how many frames fit before the next tick
(docs/engines.md#drain-bursts).

A burst pays a part once (its rows' state copied into the flush batch and back, the host's read
of the outputs) and a part a frame (the steps). Sizing the next burst by the last one's cost a
frame counts the once-part in every frame: after a burst of one frame the next is sized as if
each frame cost that whole burst, so bursts stay at a frame, each paying the copies again. The
cost is fitted instead as ``fixed + frames * per_frame`` through the latest bursts of the fewest
and the most frames; with one size seen so far, all of it counts a frame (the safe side).
"""

from __future__ import annotations

import math
import sys

# Burst sizes remembered (the latest duration of each), so a size not seen for a while drops out.
_SIZES = 8
# Of the largest burst's cost a frame, the least a frame may cost: noisy durations must not make
# frames look free.
_MIN_FRAME_SHARE = 0.25


class BurstCost:
    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}  # frames -> the latest burst of that many frames, oldest first

    def observe(self, frames: int, seconds: float) -> None:
        self._seconds.pop(frames, None)
        self._seconds[frames] = seconds
        if len(self._seconds) > _SIZES:
            del self._seconds[next(iter(self._seconds))]

    def fitted(self) -> tuple[float, float] | None:
        """``(fixed_s, frame_s)``; None before the first burst."""
        if not self._seconds:
            return None
        fewest, most = min(self._seconds), max(self._seconds)
        largest_share = self._seconds[most] / most
        if fewest == most:
            return 0.0, largest_share
        slope = (self._seconds[most] - self._seconds[fewest]) / (most - fewest)
        frame_s = max(slope, _MIN_FRAME_SHARE * largest_share)
        return max(0.0, self._seconds[fewest] - fewest * frame_s), frame_s

    def frames_within(self, room_s: float, margin: float, frame_s_unknown: float) -> int:
        """The most frames whose burst, ``margin`` times its cost, fits ``room_s``; before any burst,
        at ``frame_s_unknown`` a frame. Unbounded where a frame costs nothing (a test's clock that
        stands still)."""
        fixed_s, frame_s = self.fitted() or (0.0, frame_s_unknown)
        if frame_s <= 0:
            return sys.maxsize
        return math.floor((room_s / margin - fixed_s) / frame_s)
