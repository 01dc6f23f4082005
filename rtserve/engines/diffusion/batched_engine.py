"""What the image and video engines share (docs/engines.md#diffusion-step-batching): a
``diffusers`` pipeline loaded off the event loop (or handed in by a test or benchmark), the step
model built over it, and one ``StepBatcher`` stepping every request.

A load failure is kept in ``failure`` (the routes answer with it), never raised: the server
keeps serving its other routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from rtserve.config import ConfigError, DiffusionEngineConfig, ServerConfig
from rtserve.engines.diffusion.batcher import BatcherStats, StepBatcher
from rtserve.engines.diffusion.loading import load_pipeline
from rtserve.engines.diffusion.state import StepModel, StepState
from rtserve.engines.errors import EngineError, build_failure
from rtserve.errors import MODEL_NOT_READY
from rtserve.weights import WeightsError

log = logging.getLogger(__name__)

R = TypeVar("R")
S = TypeVar("S", bound=StepState)
O = TypeVar("O")  # noqa: E741
M = TypeVar("M", bound=StepModel[Any, Any, Any])


class BatchedEngine(Generic[M, R, S, O]):
    def __init__(
        self,
        config: ServerConfig,
        settings: DiffusionEngineConfig,
        *,
        name: str,
        field: str,
        build: Callable[[Any], M],
        pipeline: Any = None,
    ) -> None:
        """``build``: the step model over a loaded pipeline (may refuse it with ``ConfigError``);
        ``pipeline``: already loaded, otherwise ``start`` loads ``settings.weights``."""
        self._config = config
        self._settings = settings
        self._name = name
        self._field = field
        self._build = build
        self._pipeline = pipeline
        self._model: M | None = None
        self._batcher: StepBatcher[R, S, O] | None = None
        self._failure: str | None = None

    @property
    def ready(self) -> bool:
        return self._batcher is not None

    @property
    def failure(self) -> str | None:
        return self._failure

    async def start(self) -> None:
        try:
            pipeline = self._pipeline
            if pipeline is None:
                pipeline = await asyncio.to_thread(load_pipeline, self._settings, self._field, self._config)
            model = self._build(pipeline)
        except (WeightsError, ConfigError, EngineError) as exc:
            self._failure = str(exc) if isinstance(exc, ConfigError) else f"invalid config field {self._field!r}: {exc}"
            log.error("%s engine not serving: %s", self._name, self._failure)
            return
        except Exception as exc:  # kept and said: raised, it would die unseen with the start's task
            section = self._field.split(".")[0]
            self._failure = build_failure(exc, f"{self._field} and {section}.max_batch")
            log.exception("%s engine not serving: %s", self._name, self._failure)
            return
        self._model = model
        batcher = StepBatcher[R, S, O](
            model, max_batch=self._settings.max_batch, max_queued=self._settings.max_queued, name=self._name
        )
        batcher.start()
        self._batcher = batcher
        log.info("%s engine serving (batch %d)", self._name, self._settings.max_batch)

    async def stop(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await batcher.stop()

    def stats(self) -> BatcherStats | None:
        return self._batcher.stats() if self._batcher is not None else None

    def _serving(self) -> tuple[M, StepBatcher[R, S, O]]:
        """The model and batcher, or ``model_not_ready`` while loading (or for good after a failure)."""
        if self._batcher is None or self._model is None:
            raise EngineError(self._failure or f"the {self._name} engine is still loading", code=MODEL_NOT_READY)
        return self._model, self._batcher
