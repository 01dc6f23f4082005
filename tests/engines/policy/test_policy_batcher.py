"""The engine thread: batching window, max batch, bounded queue, failure isolation, resets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.engines.policy.batcher import PolicyBatcher
from rtserve.engines.policy.errors import PolicyInferenceError, PolicyOverloaded, PolicyStopped
from rtserve.engines.values import PolicyRequest

# Long enough that no test can pass by waiting it out: batches must close for the
# documented reasons (max_batch reached, every connected client waiting).
LONG_WINDOW_S = 60.0


class RecordingPolicy:
    """Policy double: actions = observation "x" * 10; records batches, thread and resets.
    ``gate`` (when set up) holds every call until the test opens it."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.events: list[str] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def server_config(self) -> dict[str, Any]:
        return {}

    def validate(self, observation: dict[str, Any]) -> None:
        pass

    def infer(self, batch):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        self.batches.append([r.session_id for r in batch])
        self.events.extend(f"infer:{r.session_id}:{r.reset}" for r in batch)
        results: list[dict[str, Any]] = []
        for r in batch:
            x = r.observation["x"]
            if x == "boom":
                raise RuntimeError("policy exploded on a weird observation")
            results.append({"actions": np.full(2, np.nan if x == "nan" else x * 10, np.float32)})
        return results

    def reset(self, session_id: str) -> None:
        self.events.append(f"reset:{session_id}")


@pytest.fixture
def policy() -> RecordingPolicy:
    return RecordingPolicy()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def make_batcher(policy, registry) -> AsyncIterator:
    started: list[PolicyBatcher] = []

    def make(
        *, max_batch: int = 8, window_s: float = LONG_WINDOW_S, max_pending: int = 64, clients: int = 0
    ) -> PolicyBatcher:
        batcher = PolicyBatcher(
            policy, max_batch=max_batch, batch_window_s=window_s, max_pending=max_pending, registry=registry
        )
        for _ in range(clients):
            batcher.client_connected()
        batcher.start()
        started.append(batcher)
        return batcher

    yield make
    if policy.gate is not None:
        policy.gate.set()
    for batcher in started:
        await asyncio.to_thread(batcher.stop)


def _request(name: str, x: Any = 1.0, reset: bool = False) -> PolicyRequest:
    return PolicyRequest(name, {"x": x}, reset=reset)


async def test_concurrent_requests_run_as_one_call_on_the_engine_thread(make_batcher, policy):
    batcher = make_batcher(max_batch=4, clients=4)
    results = await asyncio.gather(*(batcher.infer(_request(f"r{i}", float(i))) for i in range(4)))
    assert policy.batches == [["r0", "r1", "r2", "r3"]]
    assert policy.threads == {"policy-engine"}
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.actions["actions"], [i * 10, i * 10])
        assert result.batch_size == 4 and result.infer_ms >= 0 and result.queue_ms >= 0


async def test_max_batch_caps_each_call(make_batcher, policy):
    batcher = make_batcher(max_batch=3, window_s=0.05, clients=7)
    await asyncio.gather(*(batcher.infer(_request(f"r{i}")) for i in range(7)))
    assert [len(b) for b in policy.batches] == [3, 3, 1]


async def test_max_batch_one_disables_batching(make_batcher, policy):
    batcher = make_batcher(max_batch=1, clients=5)
    results = await asyncio.gather(*(batcher.infer(_request(f"r{i}")) for i in range(5)))
    assert [len(b) for b in policy.batches] == [1] * 5
    assert {r.batch_size for r in results} == {1}


async def test_window_closes_a_partial_batch(make_batcher, policy):
    # Three clients connected, two ask: the window (short here) ends the wait.
    batcher = make_batcher(max_batch=8, window_s=0.05, clients=3)
    await asyncio.gather(batcher.infer(_request("a")), batcher.infer(_request("b")))
    assert policy.batches == [["a", "b"]]


async def test_a_lone_client_does_not_wait_for_the_window(make_batcher, policy):
    batcher = make_batcher(max_batch=8, clients=1)
    result = await asyncio.wait_for(batcher.infer(_request("solo")), 10)  # window is 60 s
    assert result.batch_size == 1


async def test_requests_that_queue_behind_a_running_batch_form_the_next_one(make_batcher, policy):
    policy.gate = threading.Event()
    batcher = make_batcher(max_batch=8, window_s=0.0, clients=5)
    first = asyncio.ensure_future(batcher.infer(_request("first")))
    await asyncio.to_thread(policy.entered.wait, 10)
    rest = [asyncio.ensure_future(batcher.infer(_request(f"r{i}"))) for i in range(4)]
    await asyncio.sleep(0)
    policy.gate.set()
    await asyncio.gather(first, *rest)
    assert policy.batches == [["first"], ["r0", "r1", "r2", "r3"]]


async def test_full_queue_is_refused_at_once(make_batcher, policy, registry):
    policy.gate = threading.Event()
    batcher = make_batcher(max_batch=1, max_pending=2, clients=4)
    running = asyncio.ensure_future(batcher.infer(_request("running")))
    await asyncio.to_thread(policy.entered.wait, 10)
    queued = [asyncio.ensure_future(batcher.infer(_request(f"q{i}"))) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(PolicyOverloaded, match="queue is full"):
        await batcher.infer(_request("one too many"))
    assert registry.get_sample_value("rtserve_robot_queue_rejected_total") == 1
    policy.gate.set()
    await asyncio.gather(running, *queued)


async def test_a_failing_observation_fails_alone(make_batcher, policy):
    batcher = make_batcher(max_batch=3, clients=3)
    outcomes = await asyncio.gather(
        batcher.infer(_request("good1", 1.0)),
        batcher.infer(_request("bad", "boom")),
        batcher.infer(_request("good2", 2.0)),
        return_exceptions=True,
    )
    assert not isinstance(outcomes[0], BaseException)
    np.testing.assert_array_equal(outcomes[0].actions["actions"], [10, 10])
    assert isinstance(outcomes[1], PolicyInferenceError) and str(outcomes[1]) == "Internal inference error"
    assert not isinstance(outcomes[2], BaseException)
    np.testing.assert_array_equal(outcomes[2].actions["actions"], [20, 20])
    # One batched try, then each observation of the failed batch alone.
    assert policy.batches == [["good1", "bad", "good2"], ["good1"], ["bad"], ["good2"]]


async def test_non_finite_actions_never_reach_a_robot(make_batcher, policy):
    batcher = make_batcher(max_batch=2, clients=2)
    outcomes = await asyncio.gather(
        batcher.infer(_request("ok", 1.0)), batcher.infer(_request("nan", "nan")), return_exceptions=True
    )
    assert not isinstance(outcomes[0], BaseException) and outcomes[0].batch_size == 2
    assert isinstance(outcomes[1], PolicyInferenceError)


async def test_resets_apply_between_batches_in_order(make_batcher, policy):
    batcher = make_batcher(max_batch=1, clients=1)
    await batcher.infer(_request("s", reset=True))
    batcher.reset_session("s")
    await batcher.infer(_request("s", reset=True))
    assert policy.events == ["infer:s:True", "reset:s", "infer:s:True"]


async def test_stop_fails_what_is_still_queued(make_batcher, policy):
    policy.gate = threading.Event()
    batcher = make_batcher(max_batch=1, clients=2)
    running = asyncio.ensure_future(batcher.infer(_request("running")))
    await asyncio.to_thread(policy.entered.wait, 10)
    queued = asyncio.ensure_future(batcher.infer(_request("queued")))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(asyncio.to_thread(batcher.stop))
    with pytest.raises(PolicyStopped):
        await queued
    policy.gate.set()
    await stopping
    assert (await running).batch_size == 1  # the batch in flight still completes
    with pytest.raises(PolicyStopped):
        await batcher.infer(_request("late"))


async def test_metrics_record_batch_sizes_and_latency(make_batcher, registry):
    batcher = make_batcher(max_batch=4, clients=4)
    await asyncio.gather(*(batcher.infer(_request(f"r{i}")) for i in range(4)))
    assert registry.get_sample_value("rtserve_robot_batch_size_count") == 1
    assert registry.get_sample_value("rtserve_robot_batch_size_sum") == 4
    assert registry.get_sample_value("rtserve_robot_inference_seconds_count") == 1
    assert registry.get_sample_value("rtserve_robot_queue_seconds_count") == 4
