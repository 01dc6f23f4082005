"""Continuous batching of denoising steps (docs/engines.md#diffusion-step-batching).

One engine thread owns the model and, per tick:

1. drops cancelled jobs (their slots are free from this tick on);
2. admits queued requests FIFO while fewer than ``max_batch`` run: the head is prepared
   (``model.prepare``: prompt encoding, first latents) and joins when its key equals the
   running batch's key; an incompatible head waits until the batch drains (head-of-line,
   never reordered, so no request starves);
3. one ``model.step`` over every running state (one batched denoiser call);
4. finished states leave: ``model.finish`` decodes them and their jobs get the outputs.

Requests join and leave only between steps, each at its own step index; the counters
(``stats``) show how many denoiser calls stepped more than one request. The queue is
bounded: ``submit`` refuses with ``resource_exhausted`` beyond ``max_queued`` waiting requests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rtserve.engines.diffusion.job import DiffusionJob
from rtserve.engines.diffusion.state import StepModel, StepState
from rtserve.engines.errors import EngineError
from rtserve.errors import CANCELLED, ENGINE_ERROR, MODEL_NOT_READY, RESOURCE_EXHAUSTED, RtserveError

log = logging.getLogger(__name__)

R = TypeVar("R")
S = TypeVar("S", bound=StepState)
O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True)
class BatcherStats:
    steps: int  # batched denoiser calls
    shared_steps: int  # calls that stepped more than one request
    rows: int  # request-steps done (sum of batch sizes over calls)
    finished: int
    cancelled: int
    failed: int
    active: int  # requests in the running batch now
    queued: int  # requests waiting


@dataclass(eq=False)
class _Entry(Generic[R, S, O]):
    request: R
    job: DiffusionJob[O]
    state: S | None = None


class StepBatcher(Generic[R, S, O]):
    def __init__(self, model: StepModel[R, S, O], *, max_batch: int, max_queued: int, name: str) -> None:
        self._model = model
        self._max_batch = max_batch
        self._max_queued = max_queued
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[_Entry[R, S, O]] = deque()  # guarded by _cond
        self._running: list[_Entry[R, S, O]] = []  # engine thread only
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._steps = self._shared = self._rows = 0
        self._finished = self._cancelled = self._failed = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-steps", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Fail every queued and running job with ``cancelled`` and join the engine thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def submit(
        self, requests: Sequence[R], on_progress: Callable[[DiffusionJob[O]], None] | None = None
    ) -> list[DiffusionJob[O]]:
        """Queue ``requests`` (all or none) from the event loop; one job each."""
        loop = asyncio.get_running_loop()
        jobs = [DiffusionJob[O](loop, on_progress) for _ in requests]
        with self._cond:
            if self._stopping or self._thread is None:
                raise EngineError(f"the {self._name} engine is not running", code=MODEL_NOT_READY)
            if len(self._queue) + len(requests) > self._max_queued:
                raise EngineError(
                    f"the {self._name} engine's queue is full ({self._max_queued} waiting); retry later",
                    code=RESOURCE_EXHAUSTED,
                )
            self._queue.extend(_Entry(request, job) for request, job in zip(requests, jobs, strict=True))
            self._cond.notify()
        return jobs

    def stats(self) -> BatcherStats:
        with self._cond:
            return BatcherStats(
                steps=self._steps,
                shared_steps=self._shared,
                rows=self._rows,
                finished=self._finished,
                cancelled=self._cancelled,
                failed=self._failed,
                active=len(self._running),
                queued=len(self._queue),
            )

    # -- engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._queue and not self._running:
                    self._cond.wait()
                if self._stopping:
                    break
            self._drop_cancelled()
            self._admit()
            if self._running:
                self._step()
        stopped = EngineError(f"the {self._name} engine stopped", code=CANCELLED)
        with self._cond:
            pending = [*self._running, *self._queue]
            self._queue.clear()
        self._running.clear()
        for entry in pending:
            entry.job.fail(stopped)

    def _drop_cancelled(self) -> None:
        kept = [entry for entry in self._running if not entry.job.cancelled]
        with self._cond:
            self._cancelled += len(self._running) - len(kept)
            self._running = kept
            for entry in [entry for entry in self._queue if entry.job.cancelled]:
                self._queue.remove(entry)
                self._cancelled += 1

    def _admit(self) -> None:
        while len(self._running) < self._max_batch:
            with self._cond:
                if not self._queue:
                    return
                head = self._queue[0]
            if head.state is None:
                try:
                    head.state = self._model.prepare(head.request)
                except Exception as exc:  # noqa: BLE001  # fails this request only
                    self._fail([head], exc)
                    with self._cond:
                        self._queue.popleft()
                    continue
                head.job.progressed(0, head.state.steps_total)
            if self._running and self._running[0].state is not None and head.state.key != self._running[0].state.key:
                return  # incompatible head: it waits for the batch to drain
            with self._cond:
                self._queue.popleft()
                self._running.append(head)

    def _step(self) -> None:
        states = [entry.state for entry in self._running if entry.state is not None]
        try:
            self._model.step(states)
        except Exception as exc:  # noqa: BLE001  # a failed step fails the requests in it, not the engine
            self._fail(self._running, exc)
            self._running = []
            return
        with self._cond:
            self._steps += 1
            self._shared += len(states) > 1
            self._rows += len(states)
        for entry, state in zip(self._running, states, strict=True):
            entry.job.progressed(state.steps_done, state.steps_total)
        done = [entry for entry in self._running if entry.state is not None and entry.state.finished]
        if not done:
            return
        self._running = [entry for entry in self._running if entry not in done]
        try:
            outputs = self._model.finish([entry.state for entry in done if entry.state is not None])
        except Exception as exc:  # noqa: BLE001
            self._fail(done, exc)
            return
        with self._cond:
            self._finished += len(done)
        for entry, output in zip(done, outputs, strict=True):
            entry.job.succeed(output)

    def _fail(self, entries: Sequence[_Entry[R, S, O]], exc: Exception) -> None:
        if isinstance(exc, RtserveError):
            error = exc
        else:
            log.error("%s engine: a request failed", self._name, exc_info=exc)
            error = EngineError(f"the {self._name} engine failed on this request", code=ENGINE_ERROR)
        with self._cond:
            self._failed += len(entries)
        for entry in entries:
            entry.job.fail(error)
