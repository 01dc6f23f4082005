"""Stage pipelines: streaming through bounded queues, cancellation and failure reach every stage."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from rtserve.engines.pipeline import Pipeline, Stage, StageFailed


class Recorder:
    """Async-generator stages that note when they start, what they see, and when they close."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.source_items = 0
        self.generators: list[AsyncIterator[int]] = []

    async def source(self, count: int, delay: float = 0.0) -> AsyncIterator[int]:
        try:
            for i in range(count):
                self.source_items += 1
                yield i
                await asyncio.sleep(delay)
        finally:
            self.closed.append("source")

    def mapper(self, name: str, fn, delay: float = 0.0):
        async def generate(items: AsyncIterator[int]) -> AsyncIterator[int]:
            try:
                async for item in items:
                    await asyncio.sleep(delay)
                    yield fn(item)
            finally:
                self.closed.append(name)

        def stage(items: AsyncIterator[int]) -> AsyncIterator[int]:
            # Hold the generator, as a stage object would: closing it must not rely on GC.
            self.generators.append(generator := generate(items))
            return generator

        return stage


def stage_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if ":" in t.get_name()}


async def test_items_stream_through_every_stage_in_order() -> None:
    rec = Recorder()
    registry = CollectorRegistry()
    pipeline = Pipeline(
        "p",
        [Stage("double", rec.mapper("double", lambda x: 2 * x)), Stage("inc", rec.mapper("inc", lambda x: x + 1))],
        registry,
    )
    out = [item async for item in pipeline.run(rec.source(20))]
    assert out == [2 * i + 1 for i in range(20)]
    assert sorted(rec.closed) == ["double", "inc", "source"]
    for stage in ("double", "inc"):
        count = registry.get_sample_value(
            "rtserve_pipeline_stage_latency_seconds_count", {"pipeline": "p", "stage": stage}
        )
        assert count == 20


async def test_outputs_flow_before_the_input_ends() -> None:
    rec = Recorder()
    pipeline = Pipeline(
        "p", [Stage("a", rec.mapper("a", lambda x: x)), Stage("b", rec.mapper("b", lambda x: x))], CollectorRegistry()
    )
    async with contextlib.aclosing(pipeline.run(rec.source(1000, delay=0.01))) as outputs:
        first = await asyncio.wait_for(anext(outputs), 5)
    assert first == 0
    assert rec.source_items < 1000  # streaming, not batch-at-the-end


async def test_bounded_queues_hold_back_a_fast_source() -> None:
    rec = Recorder()
    pipeline = Pipeline(
        "p",
        [
            Stage("a", rec.mapper("a", lambda x: x), queue_size=1),
            Stage("b", rec.mapper("b", lambda x: x), queue_size=1),
        ],
        CollectorRegistry(),
        output_queue_size=1,
    )
    async with contextlib.aclosing(pipeline.run(rec.source(10_000))) as outputs:
        await anext(outputs)
        await asyncio.sleep(0.1)  # a slow consumer
        # Only the queue bounds plus one item in hand per task can be in flight.
        assert rec.source_items <= 10


async def test_closing_the_run_cancels_and_closes_every_stage() -> None:
    rec = Recorder()
    pipeline = Pipeline("p", [Stage(name, rec.mapper(name, lambda x: x)) for name in "abc"], CollectorRegistry())
    outputs = pipeline.run(rec.source(10_000))
    assert await anext(outputs) == 0
    await asyncio.sleep(0.05)  # every queue fills: each stage is parked on a full queue at its yield
    await outputs.aclose()
    assert sorted(rec.closed) == ["a", "b", "c", "source"]
    assert stage_tasks() == set()


async def test_cancelling_the_consumer_task_reaches_every_stage() -> None:
    rec = Recorder()
    started = asyncio.Event()
    pipeline = Pipeline("p", [Stage(name, rec.mapper(name, lambda x: x)) for name in "abc"], CollectorRegistry())

    async def consume() -> None:
        async for _ in pipeline.run(rec.source(10_000, delay=0.01)):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(rec.closed) == ["a", "b", "c", "source"]
    assert stage_tasks() == set()


async def test_a_failing_stage_fails_the_run_and_closes_the_others() -> None:
    rec = Recorder()

    def explode(x: int) -> int:
        if x == 3:
            raise ValueError("bad chunk")
        return x

    pipeline = Pipeline(
        "p",
        [
            Stage("a", rec.mapper("a", lambda x: x)),
            Stage("b", rec.mapper("b", explode)),
            Stage("c", rec.mapper("c", lambda x: x)),
        ],
        CollectorRegistry(),
    )
    seen = []
    with pytest.raises(StageFailed) as failed:
        async for item in pipeline.run(rec.source(10_000, delay=0.001)):
            seen.append(item)
    assert failed.value.stage == "b" and failed.value.code == "engine_error"
    assert isinstance(failed.value.__cause__, ValueError)
    assert seen == [0, 1, 2][: len(seen)]
    assert sorted(rec.closed) == ["a", "b", "c", "source"]
    assert stage_tasks() == set()


async def test_a_stage_that_stops_early_ends_the_run() -> None:
    rec = Recorder()

    async def first_two(items: AsyncIterator[int]) -> AsyncIterator[int]:
        try:
            count = 0
            async for item in items:
                yield item
                count += 1
                if count == 2:
                    return
        finally:
            rec.closed.append("first_two")

    pipeline = Pipeline(
        "p", [Stage("take", first_two), Stage("inc", rec.mapper("inc", lambda x: x + 1))], CollectorRegistry()
    )
    assert [x async for x in pipeline.run(rec.source(10_000))] == [1, 2]
    assert sorted(rec.closed) == ["first_two", "inc", "source"]


def test_pipelines_share_one_metric_family_per_registry() -> None:
    registry = CollectorRegistry()
    Pipeline("one", [Stage("s", Recorder().mapper("s", lambda x: x))], registry)
    Pipeline("two", [Stage("s", Recorder().mapper("s", lambda x: x))], registry)
    with pytest.raises(ValueError, match="unique"):
        Pipeline("dup", [Stage("s", Recorder().mapper("s", lambda x: x))] * 2, registry)
    with pytest.raises(ValueError, match="queue_size"):
        Stage("s", Recorder().mapper("s", lambda x: x), queue_size=0)


async def test_a_stage_that_cannot_start_fails_the_run_instead_of_hanging() -> None:
    def broken(items: AsyncIterator[int]) -> AsyncIterator[int]:
        raise TypeError("not a stream")

    rec = Recorder()
    pipeline = Pipeline("p", [Stage("a", rec.mapper("a", lambda x: x)), Stage("broken", broken)], CollectorRegistry())
    with pytest.raises(StageFailed) as failed:
        await asyncio.wait_for(anext(pipeline.run(rec.source(10))), 5)
    assert failed.value.stage == "broken"
    with pytest.raises(StageFailed) as failed:
        await asyncio.wait_for(anext(pipeline.run(42)), 5)  # type: ignore[arg-type]  # not an async iterable
    assert failed.value.stage == "source"
