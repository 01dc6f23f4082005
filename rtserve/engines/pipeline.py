"""Stage pipelines: a chain of streaming stages joined by bounded asyncio queues.

An engine can be a chain of stages (codec encoder -> LM -> codec decoder, or
VAD -> ASR -> LLM -> TTS). Each stage is a function from an async iterator of inputs
to an async iterator of outputs, usually an async generator function::

    async def asr(audio: AsyncIterator[Pcm]) -> AsyncIterator[TranscriptPiece]:
        async for chunk in audio:
            ...
            yield piece

    pipeline = Pipeline("cascade", [Stage("vad", vad), Stage("asr", asr, queue_size=16),
                                    Stage("llm", llm), Stage("tts", tts)], registry)
    async with contextlib.aclosing(pipeline.run(source)) as outputs:
        async for chunk in outputs:      # what the last stage yields
            ...

``source`` is any async iterable; it feeds the first stage. One ``Pipeline`` is a
reusable definition: every ``run`` call is an independent run with its own tasks and
queues (e.g. one run per turn, or one per session).

Semantics of a run:

* Streaming: every stage runs in its own task and hands each item on as soon as it is
  produced. ``Stage.queue_size`` bounds the queue in front of that stage; a slow
  stage stalls the ones upstream (backpressure), nothing buffers beyond the bounds.
* End of stream: the source's end ends the first stage's input, each stage's end ends
  the next stage's input, and the run ends after the last stage's last item. A stage
  may also stop early; the stages upstream of it are then cancelled when the run ends.
* Cancellation reaches every stage: closing the run (``aclose()``, ``aclosing``) or
  cancelling the task that iterates it cancels every stage task and closes every stage
  generator, its input iterator and the source iterator (their ``finally`` blocks run)
  before the close or cancellation completes. Breaking out of ``async for`` alone
  does not close an async generator promptly: use ``aclosing`` or call ``aclose()``.
* Failure: if a stage (or the source) raises, every other stage is cancelled and
  closed, and the run raises ``StageFailed`` (``.stage`` names it, ``__cause__`` is the
  original exception).
* Metrics: ``rtserve_pipeline_stage_latency_seconds{pipeline,stage}`` observes, for
  every item a stage emits, the time since that stage last received an input item —
  how far the stage lags its input (ASR endpointing delay, LLM time to first token,
  TTS time to first audio of a text chunk). Register once per registry; any number of
  pipelines share the family.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from rtserve.clock import Clock, SystemClock
from rtserve.engines.errors import EngineError

StageFn = Callable[[AsyncIterator[Any]], AsyncIterator[Any]]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_END = object()  # end-of-stream marker between stages

_latency_families: weakref.WeakKeyDictionary[CollectorRegistry, Histogram] = weakref.WeakKeyDictionary()


def stage_latency_histogram(registry: CollectorRegistry) -> Histogram:
    """The per-stage latency family of ``registry``, created on first use."""
    family = _latency_families.get(registry)
    if family is None:
        family = Histogram(
            "rtserve_pipeline_stage_latency_seconds",
            "Time from a stage's latest input item to each item it emits",
            ["pipeline", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        _latency_families[registry] = family
    return family


class StageFailed(EngineError):
    """A stage of a pipeline raised; the whole run was cancelled."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"pipeline stage {stage!r} failed")
        self.stage = stage


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageFn
    queue_size: int = 4  # items queued in front of this stage

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise ValueError(f"stage {self.name!r}: queue_size must be >= 1")


async def _aclose(iterator: object) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


class Pipeline:
    def __init__(
        self,
        name: str,
        stages: Sequence[Stage],
        registry: CollectorRegistry,
        *,
        output_queue_size: int = 4,
        clock: Clock | None = None,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        if len({stage.name for stage in stages}) != len(stages):
            raise ValueError("stage names must be unique within a pipeline")
        if output_queue_size < 1:
            raise ValueError("output_queue_size must be >= 1")
        self.name = name
        self.stages = tuple(stages)
        self.output_queue_size = output_queue_size
        self._clock = clock or SystemClock()
        family = stage_latency_histogram(registry)
        self._latency = {stage.name: family.labels(name, stage.name) for stage in stages}

    async def run(self, source: AsyncIterable[Any]) -> AsyncGenerator[Any, None]:
        """Stream ``source`` through every stage; yield what the last stage emits."""
        inboxes: list[asyncio.Queue[Any]] = [asyncio.Queue(stage.queue_size) for stage in self.stages]
        outbox: asyncio.Queue[Any] = asyncio.Queue(self.output_queue_size)
        failure: asyncio.Future[tuple[str, BaseException]] = asyncio.get_running_loop().create_future()
        tasks = [asyncio.create_task(self._pump(source, inboxes[0], failure), name=f"{self.name}:source")]
        for index, stage in enumerate(self.stages):
            downstream = inboxes[index + 1] if index + 1 < len(self.stages) else outbox
            tasks.append(
                asyncio.create_task(
                    self._run_stage(stage, inboxes[index], downstream, failure), name=f"{self.name}:{stage.name}"
                )
            )
        try:
            while True:
                item = await self._next_output(outbox, failure)
                if item is _END:
                    return
                yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _next_output(outbox: asyncio.Queue[Any], failure: asyncio.Future[tuple[str, BaseException]]) -> Any:
        if failure.done():
            stage, exc = failure.result()
            raise StageFailed(stage) from exc
        if not outbox.empty():
            return outbox.get_nowait()
        getter = asyncio.ensure_future(outbox.get())
        try:
            await asyncio.wait((getter, failure), return_when=asyncio.FIRST_COMPLETED)
        finally:
            getter.cancel()
        if failure.done():
            stage, exc = failure.result()
            raise StageFailed(stage) from exc
        return getter.result()

    @staticmethod
    async def _pump(
        source: AsyncIterable[Any], inbox: asyncio.Queue[Any], failure: asyncio.Future[tuple[str, BaseException]]
    ) -> None:
        iterator: AsyncIterator[Any] | None = None
        try:
            iterator = aiter(source)
            async for item in iterator:
                await inbox.put(item)
            await inbox.put(_END)
        except Exception as exc:  # noqa: BLE001 - the pipeline's failure, raised to its caller
            if not failure.done():
                failure.set_result(("source", exc))
        finally:
            await _aclose(iterator)

    async def _run_stage(
        self,
        stage: Stage,
        inbox: asyncio.Queue[Any],
        downstream: asyncio.Queue[Any],
        failure: asyncio.Future[tuple[str, BaseException]],
    ) -> None:
        clock = self._clock
        latency = self._latency[stage.name]
        last_input_at: float | None = None

        async def inputs() -> AsyncIterator[Any]:
            nonlocal last_input_at
            while (item := await inbox.get()) is not _END:
                last_input_at = clock.monotonic()
                yield item

        stage_inputs = inputs()
        outputs: AsyncIterator[Any] | None = None
        try:
            outputs = stage.run(stage_inputs)
            async for item in outputs:
                if last_input_at is not None:
                    latency.observe(clock.monotonic() - last_input_at)
                await downstream.put(item)
            await downstream.put(_END)
        except Exception as exc:  # noqa: BLE001 - the pipeline's failure, raised to its caller
            if not failure.done():
                failure.set_result((stage.name, exc))
        finally:
            await _aclose(outputs)
            await _aclose(stage_inputs)
