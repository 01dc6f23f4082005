"""Rate-limited warnings that still account for every event: the first is logged at once,
later ones at most once per interval, each line carrying how many happened since the last."""

from __future__ import annotations

import math


class LogThrottle:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last = -math.inf
        self._pending = 0

    def due(self, count: int, now: float) -> int | None:
        """Add ``count`` events; the total since the last line when a line is due now, else None."""
        self._pending += count
        if now - self._last < self.interval_s:
            return None
        self._last = now
        pending, self._pending = self._pending, 0
        return pending
