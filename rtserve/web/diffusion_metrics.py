"""A step-batched diffusion engine's counters on ``/metrics`` (the image and the video engine,
``rtserve_image_*`` / ``rtserve_video_*``), read from its ``stats()`` at scrape time: the engine
thread keeps plain counters; nothing on its hot path touches Prometheus."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rtserve.engines.diffusion.batcher import BatcherStats


class BatchedEngineStats(Protocol):
    def stats(self) -> BatcherStats | None:
        """None while the engine loads (or after it failed to)."""
        ...


class BatchedEngineCollector(Collector):
    def __init__(self, engine: BatchedEngineStats, kind: str) -> None:
        """``kind``: ``image`` or ``video``, the metric names' ``rtserve_KIND_`` prefix."""
        self._engine = engine
        self._prefix = f"rtserve_{kind}_"
        self._what = f"{kind.capitalize()} engine"

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        if stats is None:  # still loading, or failed
            return
        counters = {
            "denoiser_calls": ("batched denoiser calls (one step of every running request)", stats.steps),
            "shared_denoiser_calls": ("denoiser calls that stepped more than one request", stats.shared_steps),
            "request_steps": ("denoising steps done, summed over requests", stats.rows),
            "requests_finished": ("requests denoised to the end", stats.finished),
            "requests_cancelled": ("requests cancelled (client gone) before they finished", stats.cancelled),
            "requests_failed": ("requests the engine failed", stats.failed),
        }
        for name, (text, value) in counters.items():
            yield CounterMetricFamily(self._prefix + name, f"{self._what}: {text}", value=value)
        yield GaugeMetricFamily(self._prefix + "requests_running", f"{self._what}: requests in the batch", stats.active)
        yield GaugeMetricFamily(self._prefix + "requests_queued", f"{self._what}: requests waiting", stats.queued)
