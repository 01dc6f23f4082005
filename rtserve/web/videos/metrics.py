"""The video routes' metrics beside the engine's step counters (``rtserve_video_*``,
docs/serving.md#videos): jobs by status, the realtime video streams and the chunks they sent,
and how long a video waits for its first decoded frames (queue, denoising, the first latent
frame's decode: what a realtime client waits before its first chunk)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rtserve.codecs.fmp4 import RgbFrames
from rtserve.engines.diffusion.video_request import VideoGeneration

_FIRST_FRAMES_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0)


class VideoMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Gauge(
            "rtserve_video_jobs", "Video jobs running in this process, by status", ["status"], registry=registry
        )
        self.jobs_ended = Counter(
            "rtserve_video_jobs_ended",
            "Video jobs that ended, by status (completed, failed, cancelled: deleted while running)",
            ["status"],
            registry=registry,
        )
        self.streams = Gauge(
            "rtserve_video_realtime_sessions", "Open WS /v1/realtime/video connections", registry=registry
        )
        self.chunks = Counter(
            "rtserve_video_realtime_chunks", "fMP4 chunks sent on WS /v1/realtime/video", registry=registry
        )
        self.chunk_bytes = Counter(
            "rtserve_video_realtime_chunk_bytes", "fMP4 bytes sent on WS /v1/realtime/video", registry=registry
        )
        self.first_frames = Histogram(
            "rtserve_video_first_frames_seconds",
            "A video's submission to its first decoded frames (jobs, sync and realtime videos)",
            buckets=_FIRST_FRAMES_BUCKETS,
            registry=registry,
        )
        for status in ("queued", "in_progress"):
            self.jobs.labels(status)  # shown at 0 before the first job

    def timed(self, generation: VideoGeneration) -> VideoGeneration:
        """``generation`` (just submitted), its first decoded frames observed in ``first_frames``."""
        return _TimedGeneration(generation, self.first_frames)


METRICS = web.AppKey("video_metrics", VideoMetrics)


class _TimedGeneration:
    def __init__(self, generation: VideoGeneration, first_frames: Histogram) -> None:
        self._generation = generation
        self._first_frames = first_frames
        self._submitted = time.monotonic()

    @property
    def progress(self) -> float:
        return self._generation.progress

    async def segments(self) -> AsyncIterator[RgbFrames]:
        first = True
        async for segment in self._generation.segments():
            if first:
                self._first_frames.observe(time.monotonic() - self._submitted)
                first = False
            yield segment

    def cancel(self) -> None:
        self._generation.cancel()
