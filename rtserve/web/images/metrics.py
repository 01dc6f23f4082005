"""The image engine's step counters on ``/metrics``, read from its ``stats()`` at scrape time
(the engine thread keeps plain counters; nothing on its hot path touches Prometheus)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rtserve.engines.diffusion.service import ImageService


class ImageEngineCollector(Collector):
    def __init__(self, engine: ImageService) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        if stats is None:  # still loading, or failed
            return
        counters = {
            "denoiser_calls": ("batched denoiser calls (one step of every running request)", stats.steps),
            "shared_denoiser_calls": ("denoiser calls that stepped more than one request", stats.shared_steps),
            "request_steps": ("denoising steps done, summed over requests", stats.rows),
            "requests_finished": ("requests decoded and answered", stats.finished),
            "requests_cancelled": ("requests cancelled (client gone) before they finished", stats.cancelled),
            "requests_failed": ("requests the engine failed", stats.failed),
        }
        for name, (text, value) in counters.items():
            yield CounterMetricFamily(f"rtserve_image_{name}", f"Image engine: {text}", value=value)
        yield GaugeMetricFamily("rtserve_image_requests_running", "Image engine: requests in the batch", stats.active)
        yield GaugeMetricFamily("rtserve_image_requests_queued", "Image engine: requests waiting", stats.queued)
