"""What the image routes see of the image engine (no torch here: ``web/`` imports it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from PIL import Image

from rtserve.engines.diffusion.batcher import BatcherStats
from rtserve.engines.diffusion.job import DiffusionJob


@dataclass(frozen=True)
class ImageRequest:
    prompt: str
    width: int
    height: int
    steps: int
    guidance_scale: float
    seed: int
    negative_prompt: str | None = None
    image: Image.Image | None = None  # an edit: the source image, re-noised by ``strength``
    strength: float = 0.8


class ImageService(Protocol):
    @property
    def ready(self) -> bool: ...

    @property
    def failure(self) -> str | None:
        """Why the engine is not serving (its weights failed to load); None while loading or serving."""
        ...

    @property
    def size_multiple(self) -> int:
        """Widths and heights must be multiples of this."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def submit(self, requests: Sequence[ImageRequest]) -> list[DiffusionJob[Image.Image]]:
        """Queue ``requests`` whole (from the event loop), or raise ``EngineError``
        (``resource_exhausted`` when the queue cannot take them, ``model_not_ready`` while loading)."""
        ...

    def stats(self) -> BatcherStats | None: ...
