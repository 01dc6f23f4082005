"""One dedicated thread per model: every call on that model runs there, one at a time.

The event loop hands work over with ``await worker.run(fn, ...)`` and never blocks. A model
object is only ever touched by its own thread, so models need no locks, their intra-op
thread pools stay bounded (``config.models.cpu_threads``), and several sessions share the
one loaded copy. Jobs run by priority (lower first, FIFO within one), so a final
transcript overtakes partial re-decodes. The queue is bounded: past ``max_queue`` waiting
jobs a call fails at once with ``CapacityExhausted`` instead of growing a backlog.
Cancelling the awaiting task drops a job that has not started yet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rtserve.engines.errors import CapacityExhausted

log = logging.getLogger(__name__)

T = TypeVar("T")

PRIORITY_HIGH = 0
PRIORITY_LOW = 1
_STOP_PRIORITY = 2  # after every queued job: stop() lets the backlog finish or cancel first

_Job = tuple[int, int, "concurrent.futures.Future[Any] | None", Callable[[], Any] | None]


class ModelWorker:
    def __init__(self, name: str, max_queue: int) -> None:
        self.name = name
        self._max_queue = max_queue
        self._jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._running = False  # written by the thread only; read as a hint
        self._thread = threading.Thread(target=self._serve, name=f"rtserve-{name}", daemon=True)
        self._started = False
        self._stopped = False

    @property
    def idle(self) -> bool:
        """True when nothing is queued or running: lets optional work (partials) skip a busy model."""
        return not self._running and self._jobs.empty()

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any, priority: int = PRIORITY_HIGH) -> T:
        """Run ``fn(*args)`` on this worker's thread and return its result."""
        if self._stopped or not self._started:
            raise CapacityExhausted(f"the {self.name} model is not running")
        if self._jobs.qsize() >= self._max_queue:
            raise CapacityExhausted(
                f"the {self.name} model is busy ({self._max_queue} requests waiting); retry shortly"
            )
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((priority, next(self._order), future, lambda: fn(*args)))
        # Cancelling the awaiting task cancels ``future``; the thread then skips the job.
        return await asyncio.wrap_future(future)

    def _serve(self) -> None:
        while True:
            _, _, future, call = self._jobs.get()
            if future is None or call is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            self._running = True
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, never lost on this thread
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self._running = False

    def stop(self) -> None:
        """Cancel waiting jobs and end the thread after the running one (non-blocking)."""
        if self._stopped:
            return
        self._stopped = True
        while True:
            try:
                _, _, future, _ = self._jobs.get_nowait()
            except queue.Empty:
                break
            if future is not None:
                future.cancel()
        self._jobs.put((_STOP_PRIORITY, next(self._order), None, None))

    def join(self, timeout: float | None = None) -> None:
        if self._started:
            self._thread.join(timeout)
