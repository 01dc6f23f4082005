"""Dedicated threads per model ("lanes", one by default): every call on that model runs there.

The event loop hands work over with ``await worker.run(fn, ...)`` and never blocks. A model
object is only ever touched by its own threads, so several sessions share the one loaded
copy and its intra-op thread pools stay bounded (``config.models.cpu_threads``). With one
lane calls run one at a time and models need no locks; with more (``cascade.asr_lanes``,
``tts_lanes``: docs/engines.md#cascade-cores) up to that many run at once, on models whose
calls are thread-safe (CTranslate2 with one worker per lane, onnxruntime). Jobs run by
priority (lower first, FIFO within one), so a final transcript overtakes partial
re-decodes. The queue is bounded: past ``max_queue`` waiting
jobs a call fails at once with ``CapacityExhausted`` instead of growing a backlog.
Cancelling the awaiting task drops a job that has not started yet. A worker given a
``FirstAudioWork`` counts its high-priority jobs there while they are queued or running
(``first_audio``: later work steps aside for them).
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

from rtserve.engines.cascade.first_audio import FirstAudioWork
from rtserve.engines.errors import CapacityExhausted

log = logging.getLogger(__name__)

T = TypeVar("T")

PRIORITY_HIGH = 0
PRIORITY_LOW = 1
_STOP_PRIORITY = 2  # after every queued job: stop() lets the backlog finish or cancel first

_Job = tuple[int, int, "concurrent.futures.Future[Any] | None", Callable[[], Any] | None]


class ModelWorker:
    def __init__(self, name: str, max_queue: int, lanes: int = 1, first_audio: FirstAudioWork | None = None) -> None:
        self.name = name
        self._first_audio = first_audio
        self._max_queue = max_queue
        self._jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._lanes = lanes
        self._running = 0  # jobs running now; written under ``_count_lock``, read as a hint
        self._count_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._serve, name=f"rtserve-{name}-{lane}", daemon=True) for lane in range(lanes)
        ]
        self._started = False
        self._stopped = False

    @property
    def idle(self) -> bool:
        """True when a lane is free and nothing waits: lets optional work (partials) skip a busy model."""
        return self._running < self._lanes and self._jobs.empty()

    def start(self) -> None:
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()

    async def run(self, fn: Callable[..., T], *args: Any, priority: int = PRIORITY_HIGH) -> T:
        """Run ``fn(*args)`` on this worker's thread and return its result."""
        if self._stopped or not self._started:
            raise CapacityExhausted(f"the {self.name} model is not running")
        if self._jobs.qsize() >= self._max_queue:
            raise CapacityExhausted(
                f"the {self.name} model is busy ({self._max_queue} requests waiting); retry shortly"
            )
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._first_audio is not None and priority == PRIORITY_HIGH:
            first_audio = self._first_audio
            first_audio.begin()
            future.add_done_callback(lambda _: first_audio.end())  # done, failed or cancelled alike
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
            with self._count_lock:
                self._running += 1
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, never lost on this thread
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._count_lock:
                    self._running -= 1

    def stop(self) -> None:
        """Cancel waiting jobs and end every lane after its running job (non-blocking)."""
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
        for _ in self._threads:  # one stop job per lane: each lane ends on the first it takes
            self._jobs.put((_STOP_PRIORITY, next(self._order), None, None))

    def join(self, timeout: float | None = None) -> None:
        if self._started:
            for thread in self._threads:
                thread.join(timeout)
