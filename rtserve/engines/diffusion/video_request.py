"""What the video routes hand the video engine, and what they get back: torch-free, so the
routes in ``web/videos`` import only this (docs/engines.md#video-generation)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from rtserve.codecs.fmp4 import RgbFrames
from rtserve.engines.diffusion.batcher import BatcherStats


@dataclass(frozen=True)
class VideoRequest:
    """One video to generate (checked by the route: docs/serving.md#videos)."""

    prompt: str
    width: int
    height: int
    num_frames: int  # 4k + 1: the VAE's temporal compression
    num_inference_steps: int
    guidance_scale: float
    seed: int | None = None
    negative_prompt: str = ""
    image: RgbFrames | None = None  # image to video: (1, height, width, 3), already resized


class VideoGeneration(Protocol):
    """One submitted video: progress while it is denoised, then its frames as they are decoded."""

    @property
    def progress(self) -> float:
        """0..1: denoising steps done over all steps (decoding is not counted)."""
        ...

    def segments(self) -> AsyncIterator[RgbFrames]:
        """The decoded frames, a segment at a time, once denoising ends; raises the
        ``RtserveError`` that failed the generation (``cancelled`` once cancelled)."""
        ...

    def cancel(self) -> None: ...


class VideoService(Protocol):
    """The video engine as the routes see it."""

    @property
    def ready(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...

    @property
    def model_name(self) -> str: ...

    @property
    def size_multiple(self) -> int:
        """Widths and heights must be multiples of this."""
        ...

    @property
    def frame_multiple(self) -> int:
        """Frame counts must be ``k * frame_multiple + 1``."""
        ...

    def submit(self, request: VideoRequest, on_progress: Callable[[], None] | None = None) -> VideoGeneration:
        """Queue ``request``: ``resource_exhausted`` when the queue is full, ``model_not_ready``
        before the engine serves. ``on_progress`` runs on the engine thread after each step."""
        ...

    def stats(self) -> BatcherStats | None:
        """The step counters (``/metrics``); None while loading or after a failed load."""
        ...
