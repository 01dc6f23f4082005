"""Injectable time, so TTLs, timers and tick pacing are testable without sleeping."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


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
