"""When a session's input audio arrived, looked up by what a lockstep tick stepped."""

from __future__ import annotations

from collections import deque

# Pushes kept while their tick is pending: far more than an engine backlog holds (a few seconds
# of 20-80 ms pushes); beyond it the oldest go.
_MAX_ARRIVALS = 4096


class InputArrivals:
    """Push times of one session's input, by the running sample count after each push.

    A lockstep engine says, with each frame, how many of the session's input samples were gone
    from its backlog after that tick (``OutputAudio.input_samples``: stepped or trimmed); the
    push holding the newest of them says when the audio that frame answers arrived. Both sides
    count the same samples: the engine counts what it cleared from a backlog as gone, and audio
    cleared before it was sent to the engine is taken back here (``take_back``)."""

    def __init__(self) -> None:
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=_MAX_ARRIVALS)
        self._pushed = 0
        self._stepped = 0

    def push(self, samples: int, at: float) -> None:
        self._pushed += samples
        self._arrivals.append((self._pushed, at))

    def take_back(self, samples: int) -> None:
        """The newest ``samples`` pushed will never reach the engine (cleared before they were
        sent, whole pushes): forget them, or every later answer would read older than it is."""
        self._pushed -= samples
        while self._arrivals and self._arrivals[-1][0] > self._pushed:
            self._arrivals.pop()

    def arrival_of(self, stepped: int) -> float | None:
        """When the newest of the first ``stepped`` samples arrived; None when no input was
        stepped since the last answer."""
        if stepped <= self._stepped:
            return None
        self._stepped = stepped
        while self._arrivals and self._arrivals[0][0] < stepped:  # pushes that ended before that sample
            self._arrivals.popleft()
        return self._arrivals[0][1] if self._arrivals else None
