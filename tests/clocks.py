"""Virtual clocks for tests: time moves only when a test says so, so timers, TTLs and
tick pacing are tested without sleeping (docs/design.md#processes-threads-and-time)."""

from __future__ import annotations

import asyncio
import threading


class FakeClock:
    """Manual time for tests: ``sleep`` waits until ``advance`` moves time past its deadline."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._now + seconds, fut))
        await fut

    def advance(self, seconds: float) -> None:
        self._now += seconds
        due = [w for w in self._waiters if w[0] <= self._now]
        self._waiters = [w for w in self._waiters if w[0] > self._now]
        for _, fut in due:
            if not fut.done():
                fut.set_result(None)


class FakeTickClock:
    """Virtual time: ``sleep_until`` jumps to the deadline, ``advance`` simulates work."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def sleep_until(self, deadline: float) -> None:
        with self._lock:
            self._now = max(self._now, deadline)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
