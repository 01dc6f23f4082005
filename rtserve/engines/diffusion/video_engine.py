"""The video engine behind ``/v1/videos`` and ``WS /v1/realtime/video``: the Wan pipeline
``video_engine.weights`` names, a ``WanVideoStepModel`` over it and a ``StepBatcher`` stepping
every request's denoising (docs/engines.md#video-generation).

Denoising is batched on the batcher's thread; decoding is not: a finished request's latents are
decoded a latent frame at a time on this engine's decode thread, so the first frames can be
encoded and sent while the rest decode, and a long decode never holds other requests' steps.
Built in the front-end process that serves the routes, loaded in the background at startup
(the routes answer ``model_not_ready`` meanwhile), stopped with the app.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from rtserve.codecs.fmp4 import RgbFrames
from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.diffusion.batched_engine import BatchedEngine
from rtserve.engines.diffusion.job import DiffusionJob
from rtserve.engines.diffusion.video_model import VideoState, WanVideoStepModel
from rtserve.engines.diffusion.video_request import VideoRequest
from rtserve.engines.errors import EngineError
from rtserve.errors import CANCELLED

FIELD = "video_engine.weights"
_WAN_PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")


def served_name(weights: str) -> str:
    """The model name clients see: the repo id, or a local folder's own name (never its path)."""
    return os.path.basename(os.path.normpath(weights)) if os.path.isdir(weights) else weights.removeprefix("hf://")


def _wan_model(pipeline: Any) -> WanVideoStepModel:
    _check_wan(pipeline)
    return WanVideoStepModel(pipeline)


def _check_wan(pipeline: Any) -> None:
    """Refuse what ``WanVideoStepModel`` does not step: not a Wan layout, Wan 2.2's two-expert
    transformers, or Wan 2.1's CLIP-conditioned image-to-video transformer."""
    missing = [part for part in _WAN_PARTS if getattr(pipeline, part, None) is None]
    if missing or pipeline.vae.__class__.__name__ != "AutoencoderKLWan":
        reason = f"missing {', '.join(missing) or 'a Wan VAE'}"
    elif getattr(pipeline, "transformer_2", None) is not None:
        reason = "two transformers (Wan 2.2 A14B) are not served"
    elif pipeline.transformer.config.get("image_dim") is not None:
        reason = "a CLIP image-conditioned transformer (Wan 2.1 I2V) is not served"
    else:
        return
    raise ConfigError(
        f"invalid config field {FIELD!r}: not a servable Wan pipeline ({type(pipeline).__name__}: {reason})"
    )


class VideoGenerationJob:
    """A ``VideoGeneration``: the batcher's job for the denoising, this engine's thread for decoding."""

    def __init__(self, job: DiffusionJob[torch.Tensor], model: WanVideoStepModel, decoder: ThreadPoolExecutor) -> None:
        self._job = job
        self._model = model
        self._decoder = decoder

    @property
    def progress(self) -> float:
        return self._job.steps_done / self._job.steps_total if self._job.steps_total else 0.0

    async def segments(self) -> AsyncIterator[RgbFrames]:
        latents = await self._job.result()
        loop = asyncio.get_running_loop()
        frames: Iterator[RgbFrames] = self._model.decode_segments(latents)
        while True:
            if self._job.cancelled:
                raise EngineError("the request was cancelled", code=CANCELLED)
            segment = await loop.run_in_executor(self._decoder, next, frames, None)
            if segment is None:
                return
            yield segment

    def cancel(self) -> None:
        self._job.cancel()


class VideoEngine(BatchedEngine[WanVideoStepModel, VideoRequest, VideoState, torch.Tensor]):
    def __init__(self, config: ServerConfig, pipeline: Any = None) -> None:
        """``pipeline``: a loaded diffusers ``WanPipeline`` (tests, benchmarks); otherwise
        ``start`` loads ``video_engine.weights``."""
        super().__init__(config, config.video_engine, name="video", field=FIELD, build=_wan_model, pipeline=pipeline)
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="video-decode")
        self.model_name = served_name(config.video_engine.weights or "video")

    @property
    def size_multiple(self) -> int:
        return self._model.size_multiple if self._model is not None else 16

    @property
    def frame_multiple(self) -> int:
        return self._model.frame_multiple if self._model is not None else 4

    async def stop(self) -> None:
        await super().stop()
        self._decoder.shutdown(wait=False, cancel_futures=True)

    def submit(self, request: VideoRequest, on_progress: Callable[[], None] | None = None) -> VideoGenerationJob:
        model, batcher = self._serving()
        callback = (lambda _job: on_progress()) if on_progress is not None else None
        (job,) = batcher.submit([request], callback)
        return VideoGenerationJob(job, model, self._decoder)
