"""The image engine behind ``/v1/images/generations`` and ``/v1/images/edits``: the pipeline
``image_engine.weights`` names, a ``UNetStepModel`` over it, and a ``StepBatcher`` stepping every
request (docs/engines.md#diffusion-step-batching).

Built in the front-end process that serves the routes, loaded in the background at startup
(the routes answer ``model_not_ready`` meanwhile), stopped with the app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from rtserve.config import ServerConfig
from rtserve.engines.diffusion.batched_engine import BatchedEngine
from rtserve.engines.diffusion.job import DiffusionJob
from rtserve.engines.diffusion.service import ImageRequest
from rtserve.engines.diffusion.unet import UNetState, UNetStepModel

FIELD = "image_engine.weights"


class ImageEngine(BatchedEngine[UNetStepModel, ImageRequest, UNetState, Image.Image]):
    def __init__(self, config: ServerConfig, pipeline: Any = None) -> None:
        """``pipeline``: a loaded diffusers pipeline (tests, benchmarks); otherwise ``start``
        loads ``image_engine.weights``."""
        super().__init__(config, config.image_engine, name="image", field=FIELD, build=UNetStepModel, pipeline=pipeline)

    @property
    def size_multiple(self) -> int:
        """Widths and heights must be multiples of this."""
        return self._model.size_multiple if self._model is not None else 8

    def submit(self, requests: Sequence[ImageRequest]) -> list[DiffusionJob[Image.Image]]:
        """Queue ``requests`` (all or none): ``resource_exhausted`` when the queue cannot take them."""
        _model, batcher = self._serving()
        return batcher.submit(requests)
