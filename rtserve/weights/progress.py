"""Download progress: bytes, rate and ETA as log lines at a bounded rate, and the fraction done
that ``/health`` reports as ``downloading`` (docs/engines.md#hub-weights).

``huggingface_hub`` reports bytes through the ``tqdm_class`` it is given (``hub.bar_class``:
one that draws nothing and adds what it is told to one ``DownloadProgress``). Downloads run in
threads (engines load off the event loop); ``BOARD`` is this process's set of downloads in
flight, which the engine set reads and announces to its workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DownloadStatus:
    """Bytes of the downloads in flight: done of total (both 0 before any size is known)."""

    done: int
    total: int

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


class DownloadProgress:
    """One resolution's downloads (several files, maybe several repos): the planned total, the
    bytes received, and a log line at most every ``interval_s`` while it runs."""

    def __init__(
        self,
        label: str,
        *,
        interval_s: float,
        board: DownloadBoard | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.interval_s = interval_s
        self._board = board
        self._clock = clock
        self._lock = threading.Lock()
        self._total = 0
        self._done = 0
        self._started = 0.0
        self._last_line = 0.0

    @property
    def status(self) -> DownloadStatus:
        with self._lock:
            return DownloadStatus(self._done, self._total)

    def begin(self, total: int) -> None:
        """The bytes about to be downloaded (files already in the cache are not counted)."""
        with self._lock:
            self._total, self._done = total, 0
            self._started = self._last_line = self._clock()
        if self._board is not None:
            self._board.add(self)
        log.info("downloading %s: %s", self.label, human_bytes(total))

    def advance(self, count: int) -> None:
        """Bytes received (negative when a server ignored a resume and the file starts over)."""
        with self._lock:
            self._done = max(0, self._done + count)
            now = self._clock()
            due = now - self._last_line >= self.interval_s
            if due:
                self._last_line = now
            done, total, elapsed = self._done, self._total, now - self._started
        if not due:
            return
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {_duration((total - done) / rate)}" if rate > 0 and total > done else ""
        log.info(
            "downloading %s: %s of %s (%.1f%%), %s/s%s",
            self.label,
            human_bytes(done),
            human_bytes(total),
            100 * DownloadStatus(done, total).fraction,
            human_bytes(rate),
            eta,
        )
        if self._board is not None:
            self._board.changed()

    def finish(self) -> None:
        with self._lock:
            done, elapsed = self._done, self._clock() - self._started
        if self._board is not None:
            self._board.remove(self)
        log.info("downloaded %s: %s in %s", self.label, human_bytes(done), _duration(elapsed))


class DownloadBoard:
    """The downloads in flight in this process; listeners hear of each change (from the
    downloading thread: a listener on an event loop hands over with ``call_soon_threadsafe``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: list[DownloadProgress] = []
        self._listeners: list[Callable[[], None]] = []

    def status(self) -> DownloadStatus | None:
        """All downloads in flight together; None when there are none."""
        with self._lock:
            active = list(self._active)
        if not active:
            return None
        each = [progress.status for progress in active]
        return DownloadStatus(sum(s.done for s in each), sum(s.total for s in each))

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Add ``listener``; returns the call that removes it."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def add(self, progress: DownloadProgress) -> None:
        with self._lock:
            self._active.append(progress)
        self.changed()

    def remove(self, progress: DownloadProgress) -> None:
        with self._lock:
            if progress in self._active:
                self._active.remove(progress)
        self.changed()

    def changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()


BOARD = DownloadBoard()
