"""Metrics every rtserve process exports about itself, and merging several processes' metrics.

Each process (the single server, every worker, the engine process) reports its CPU
seconds and memory (prometheus-client's ``ProcessCollector``), its event-loop lag (how
late a timer fires, the direct measure of a saturated loop) and its garbage-collection
pauses. With workers, any worker's ``/metrics`` shows every process: the engine process
merges the expositions workers push to it, each worker's samples labelled ``worker="i"``
(prometheus-client's multiprocess mode needs one shared directory and process-global
metrics; this needs neither).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rtserve import heap

_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
_LAG_PROBE_S = 0.1


class ProcessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ProcessCollector(registry=registry)
        self.loop_lag = Histogram(
            "rtserve_event_loop_lag_seconds",
            "How late a 100 ms timer of this process's event loop fired",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        # A collection holds the GIL: every thread of the process (engine thread, event loop) waits it out.
        gc_pause = Histogram(
            "rtserve_gc_pause_seconds",
            "Garbage collections of this process, by generation (2: full), and how long each held it",
            ["generation"],
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        # Bound once: the callback runs inside every collection, young ones hundreds of times a second.
        self._gc_pause = [gc_pause.labels(str(generation)) for generation in range(3)]
        Gauge(
            "rtserve_gc_frozen_objects",
            "Objects this process loaded before serving, kept out of garbage collections (rtserve/heap.py)",
            registry=registry,
        ).set_function(heap.frozen_objects)
        registry.register(TorchCudaMemory())
        self._task: asyncio.Task[None] | None = None
        self._gc_started = 0.0

    def start(self) -> None:
        self._task = asyncio.create_task(self._probe())
        gc.callbacks.append(self._on_gc)

    async def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_pause[info["generation"]].observe(time.perf_counter() - self._gc_started)

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + _LAG_PROBE_S
            await asyncio.sleep(_LAG_PROBE_S)
            self.loop_lag.observe(max(0.0, loop.time() - due))


class TorchCudaMemory(Collector):
    """What torch's CUDA caching allocator of this process holds, per device: ``allocated`` (in
    tensors) and ``reserved`` (taken from the driver, cached blocks included). Several processes share
    a GPU in the one-GPU voice layout (the engine process, the TTS server), and a model that does not
    fit beside them (issue 34's in-process LLM on an 80 GB card) is explained by these. Nothing where
    this process never used CUDA: the collector neither imports torch nor starts CUDA, and it reads
    the allocator's own counters, no CUDA call (a scrape during a graph capture must not break it)."""

    def collect(self) -> Iterator[Metric]:
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_initialized():
                return
        except AttributeError:  # another thread is importing torch (a policy loading after /health is up)
            return
        family = GaugeMetricFamily(
            "rtserve_torch_cuda_memory_bytes",
            "GPU memory torch's caching allocator of this process holds, by device and kind "
            "(allocated: in tensors; reserved: taken from the driver, cached blocks included)",
            labels=["device", "kind"],
        )
        for device in range(torch.cuda.device_count()):
            family.add_metric([str(device), "allocated"], torch.cuda.memory_allocated(device))
            family.add_metric([str(device), "reserved"], torch.cuda.memory_reserved(device))
        yield family


def merge_expositions(own: bytes, others: Mapping[str, bytes], label: str = "worker") -> bytes:
    """One exposition: ``own`` as is, each of ``others`` with ``label="<key>"`` on its samples.

    Line by line on the text format (each family a ``# HELP`` and ``# TYPE`` line, then its
    samples), not parsed into objects and rendered again: this runs on the engine process's
    loop for every scrape, and a parse of a dozen processes' metrics held it for tens of
    milliseconds, a stall every session of the server felt."""
    families: dict[bytes, list[bytes]] = {}  # the family's HELP line -> its lines
    for key, text in [(None, own), *others.items()]:
        tag = None if key is None else f'{label}="{key}"'.encode()
        lines: list[bytes] = []
        for line in text.splitlines():
            if line.startswith(b"# HELP "):
                lines = families.setdefault(line, [line])
            elif line.startswith(b"#"):
                if len(lines) == 1:  # the TYPE line, kept once per family
                    lines.append(line)
            elif line:
                lines.append(line if tag is None else _labelled(line, tag))
    return b"".join(line + b"\n" for lines in families.values() for line in lines)


def _labelled(sample: bytes, tag: bytes) -> bytes:
    name_end = min(i for i in (sample.find(b"{"), sample.find(b" ")) if i >= 0)
    if sample[name_end : name_end + 1] == b"{":
        return sample[: name_end + 1] + tag + b"," + sample[name_end + 1 :]
    return sample[:name_end] + b"{" + tag + b"}" + sample[name_end:]
