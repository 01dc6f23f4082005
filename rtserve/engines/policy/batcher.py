"""Dynamic batching of policy requests on one dedicated engine thread.

Connections call ``await batcher.infer(request)`` from the event loop. Requests wait in a
bounded queue (full -> ``PolicyOverloaded`` at once, never unbounded growth). The engine
thread takes the oldest request, waits until ``batch_window_s`` after that request was
queued (or until ``max_batch`` are waiting) and runs ONE ``policy.infer`` over all of
them. Requests that piled up while the previous batch ran join the next one without
waiting again, so under load batches grow by themselves. Each connected client has at
most one request in flight, so once every connected client is waiting the batch cannot
grow and runs at once: a lone robot never pays the window.

Isolation: if a batched call raises, every request of that batch is retried alone, so
only the observation that breaks the policy gets an error. Session resets and releases
are control operations applied between batches, in order with the requests.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from rtserve.engines.policy.errors import PolicyInferenceError, PolicyOverloaded, PolicyStopped
from rtserve.engines.protocols import PolicyEngine
from rtserve.engines.values import PolicyRequest

log = logging.getLogger(__name__)

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class PolicyResult:
    actions: dict[str, Any]
    queue_ms: float  # queued -> batch started
    infer_ms: float  # the batched policy call
    batch_size: int


@dataclass
class _Pending:
    request: PolicyRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[PolicyResult]
    queued_at: float


def _resolve(future: asyncio.Future[PolicyResult], outcome: PolicyResult | BaseException) -> None:
    # Runs on the loop; the caller may have gone away (cancelled) meanwhile.
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _check_actions(actions: object) -> dict[str, Any]:
    """The action contract: a dict whose float arrays are all finite (a NaN must never
    reach a robot)."""
    if not isinstance(actions, dict):
        raise TypeError(f"policy returned {type(actions).__name__}, expected dict")
    for key, value in actions.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
            raise ValueError(f"policy returned non-finite values in {key!r}")
    return actions


class BatcherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.batch_size = Histogram(
            "rtserve_robot_batch_size", "Observations per policy call", buckets=_BATCH_BUCKETS, registry=registry
        )
        self.inference_seconds = Histogram(
            "rtserve_robot_inference_seconds",
            "Duration of one batched policy call",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_seconds = Histogram(
            "rtserve_robot_queue_seconds",
            "Time an observation waited for its batch",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.rejected = Counter(
            "rtserve_robot_queue_rejected", "Observations refused because the queue was full", registry=registry
        )


class PolicyBatcher:
    """Owns the policy and the one thread that calls it."""

    def __init__(
        self,
        policy: PolicyEngine,
        *,
        max_batch: int,
        batch_window_s: float,
        max_pending: int,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._policy = policy
        self._max_batch = max_batch
        self._window_s = batch_window_s
        self._max_pending = max_pending
        self._clock = clock
        self._metrics = BatcherMetrics(registry)
        self._cond = threading.Condition()
        self._requests: deque[_Pending] = deque()
        # Resets/releases: at most one per connection event, applied before the next batch.
        self._controls: deque[str] = deque(maxlen=max_pending)
        self._running = False
        self._thread: threading.Thread | None = None
        self._clients = 0  # connected clients, each with at most one request in flight

    @property
    def policy(self) -> PolicyEngine:
        return self._policy

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name="policy-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish the batch in flight, fail everything still queued, join the thread."""
        with self._cond:
            self._running = False
            stranded = list(self._requests)
            self._requests.clear()
            self._cond.notify_all()
        for pending in stranded:
            pending.loop.call_soon_threadsafe(_resolve, pending.future, PolicyStopped("policy server is stopping"))
        if self._thread is not None:
            self._thread.join()

    async def infer(self, request: PolicyRequest) -> PolicyResult:
        loop = asyncio.get_running_loop()
        pending = _Pending(request, loop, loop.create_future(), self._clock())
        with self._cond:
            if not self._running:
                raise PolicyStopped("policy server is stopping")
            if len(self._requests) >= self._max_pending:
                self._metrics.rejected.inc()
                raise PolicyOverloaded(f"policy queue is full ({self._max_pending} observations waiting); retry later")
            self._requests.append(pending)
            self._cond.notify()
        return await pending.future

    def client_connected(self) -> None:
        with self._cond:
            self._clients += 1

    def client_disconnected(self) -> None:
        with self._cond:
            self._clients -= 1
            self._cond.notify()  # a waiting batch may now be complete

    def reset_session(self, session_id: str) -> None:
        """Forget a session's policy state before the next batch (never blocks)."""
        with self._cond:
            self._controls.append(session_id)
            self._cond.notify()

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._requests and not self._controls:
                    self._cond.wait()
                if not self._running:
                    return
                controls = list(self._controls)
                self._controls.clear()
            self._apply_controls(controls)
            batch = self._collect_batch()
            if batch:
                self._serve(batch)

    def _apply_controls(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            try:
                self._policy.reset(session_id)
            except Exception:
                log.exception("policy reset failed for session %s", session_id)

    def _collect_batch(self) -> list[_Pending]:
        with self._cond:
            if not self._requests:
                return []
            deadline = self._requests[0].queued_at + self._window_s
            while self._running and len(self._requests) < min(self._max_batch, self._clients):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            count = min(self._max_batch, len(self._requests))
            return [self._requests.popleft() for _ in range(count)]

    def _serve(self, batch: list[_Pending]) -> None:
        started = self._clock()
        outcomes = self._infer_isolated(batch)
        infer_s = self._clock() - started
        self._metrics.batch_size.observe(len(batch))
        self._metrics.inference_seconds.observe(infer_s)
        for pending, outcome in zip(batch, outcomes):
            queue_s = started - pending.queued_at
            self._metrics.queue_seconds.observe(queue_s)
            resolved = (
                outcome
                if isinstance(outcome, BaseException)
                else PolicyResult(outcome, queue_ms=queue_s * 1000, infer_ms=infer_s * 1000, batch_size=len(batch))
            )
            pending.loop.call_soon_threadsafe(_resolve, pending.future, resolved)

    def _infer_isolated(self, batch: list[_Pending]) -> list[dict[str, Any] | BaseException]:
        try:
            actions = self._policy.infer([pending.request for pending in batch])
        except Exception:
            if len(batch) == 1:
                log.exception("policy inference failed (session %s)", batch[0].request.session_id)
                return [PolicyInferenceError("Internal inference error")]
            # A raising policy has not committed any state: retry alone to find the culprit.
            log.warning("batched policy call failed; retrying its %d observations one by one", len(batch))
            return [self._infer_isolated([pending])[0] for pending in batch]
        if not isinstance(actions, list) or len(actions) != len(batch):
            log.error("policy returned %s for %d observations", type(actions).__name__, len(batch))
            return [PolicyInferenceError("Internal inference error") for _ in batch]
        return [self._checked(pending, result) for pending, result in zip(batch, actions)]

    @staticmethod
    def _checked(pending: _Pending, actions: object) -> dict[str, Any] | BaseException:
        try:
            return _check_actions(actions)
        except (TypeError, ValueError) as exc:
            log.error("policy output rejected (session %s): %s", pending.request.session_id, exc)
            return PolicyInferenceError("Internal inference error")
