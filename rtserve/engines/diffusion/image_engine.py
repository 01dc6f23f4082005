"""The image engine behind ``/v1/images/generations`` and ``/v1/images/edits``: the pipeline
``image_engine.weights`` names, a ``UNetStepModel`` over it, and a ``StepBatcher`` stepping every
request (docs/engines.md#diffusion-step-batching).

Built in the front-end process that serves the routes, loaded in the background at startup
(the routes answer ``model_not_ready`` meanwhile), stopped with the app.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from PIL import Image

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.diffusion.batcher import BatcherStats, StepBatcher
from rtserve.engines.diffusion.job import DiffusionJob
from rtserve.engines.diffusion.loading import load_pipeline
from rtserve.engines.diffusion.service import ImageRequest
from rtserve.engines.diffusion.unet import UNetState, UNetStepModel
from rtserve.engines.errors import EngineError
from rtserve.errors import MODEL_NOT_READY
from rtserve.weights import WeightsError

log = logging.getLogger(__name__)

FIELD = "image_engine.weights"


class ImageEngine:
    def __init__(self, config: ServerConfig, pipeline: Any = None) -> None:
        """``pipeline``: a loaded diffusers pipeline (tests, benchmarks); otherwise ``start``
        loads ``image_engine.weights``."""
        self._config = config
        self._pipeline = pipeline
        self._model: UNetStepModel | None = None
        self._batcher: StepBatcher[ImageRequest, UNetState, Image.Image] | None = None
        self._failure: str | None = None

    @property
    def ready(self) -> bool:
        return self._batcher is not None

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def size_multiple(self) -> int:
        """Widths and heights must be multiples of this."""
        return self._model.size_multiple if self._model is not None else 8

    async def start(self) -> None:
        settings = self._config.image_engine
        try:
            pipeline = self._pipeline
            if pipeline is None:
                pipeline = await asyncio.to_thread(load_pipeline, settings, FIELD, self._config)
            model = UNetStepModel(pipeline)
        except (WeightsError, ConfigError, EngineError) as exc:
            self._failure = str(exc) if isinstance(exc, ConfigError) else f"invalid config field {FIELD!r}: {exc}"
            log.error("image engine not serving: %s", self._failure)
            return
        self._model = model
        batcher = StepBatcher[ImageRequest, UNetState, Image.Image](
            model, max_batch=settings.max_batch, max_queued=settings.max_queued, name="image"
        )
        batcher.start()
        self._batcher = batcher
        log.info("image engine serving (batch %d)", settings.max_batch)

    async def stop(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await batcher.stop()

    def submit(self, requests: Sequence[ImageRequest]) -> list[DiffusionJob[Image.Image]]:
        """Queue ``requests`` (all or none): ``resource_exhausted`` when the queue cannot take them."""
        if self._batcher is None:
            raise EngineError(self._failure or "the image engine is still loading", code=MODEL_NOT_READY)
        return self._batcher.submit(requests)

    def stats(self) -> BatcherStats | None:
        return self._batcher.stats() if self._batcher is not None else None
