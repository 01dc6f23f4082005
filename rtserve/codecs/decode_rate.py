"""A per-connection bound on decoded audio per second of wall time (a token bucket).

Opus packets of two bytes can each decode to 120 ms, so a small Ogg page can stand for a
minute of audio: a per-chunk bound (``OggOpusReader``'s ``max_feed_seconds``) alone lets one
client make the server decode hours of audio a minute. A live client decodes 1 s per second;
the bucket allows ``ratio`` seconds per second plus ``burst_s`` ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rtserve.codecs.errors import AudioLimitError
from rtserve.errors import DECODE_RATE_EXCEEDED


class DecodeRateError(AudioLimitError):
    """A connection decoded audio faster than its configured rate allows."""

    code = DECODE_RATE_EXCEEDED


class DecodeRateLimit:
    """Charge decoded seconds; raises ``DecodeRateError`` once a connection runs past its allowance.

    Used from one thread at a time (a connection's decodes run one after another)."""

    def __init__(self, ratio: float, burst_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ratio = ratio
        self.burst_s = burst_s
        self._clock = clock
        self._allowance = burst_s
        self._at = clock()

    def charge(self, seconds: float) -> None:
        now = self._clock()
        self._allowance = min(self.burst_s, self._allowance + (now - self._at) * self.ratio)
        self._at = now
        self._allowance -= seconds
        if self._allowance < 0:
            raise DecodeRateError(f"decoded audio faster than {self.ratio:g} s per second (burst {self.burst_s:g} s)")
