"""What the Kyutai STT and TTS engines share: a model stepped by a lockstep scheduler of its own,
loaded in ``start`` on a thread while the server answers, and a sleep-mode stage
(docs/serving.md#sleep-mode).

Streams are refused with ``engine_unavailable`` while the model loads, and for good, with the
reason, if loading failed (the start never raises: raised, the failure would die unseen with the
start's task). Asleep, the scheduler stops (streams in flight end with ``engine_sleeping``, new ones
are refused with it) and the model is dropped; a wake loads it again as ``start`` did. The
scheduler's metrics live in a registry of its own (the realtime engine may be lockstep too) and
show in the server's under the engine's prefix.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

import torch
from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.errors import EngineError, build_failure
from rtserve.engines.events import EngineFailure
from rtserve.engines.lockstep.renamed_metrics import RenamedMetrics
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.errors import ENGINE_SLEEPING, ENGINE_UNAVAILABLE
from rtserve.weights import WeightsError

log = logging.getLogger(__name__)


class ScheduledEngine(ABC):
    """``start``/``stop``, readiness and sleep mode around ``_serve``, which loads the model and
    starts ``_scheduler``; ``_forget_model`` drops what ``_serve`` built."""

    stage: str  # its sleep-mode stage: "stt_engine", "tts_engine"
    weights_field: str  # the setting naming its weights, in a failure it caused
    sized_by: str  # the settings that size its batches, named when the GPU has no room for them
    speaks_of_itself: str  # "the speech-to-text engine", in what clients are told

    def __init__(self, config: ServerConfig, registry: CollectorRegistry | None, metrics_prefix: str) -> None:
        """``registry``: the server's, where the scheduler's metrics show under ``metrics_prefix``."""
        self._config = config
        self._scheduler: LockstepScheduler | None = None
        self._lockstep_metrics = RenamedMetrics(CollectorRegistry(), metrics_prefix)
        if registry is not None:
            registry.register(self._lockstep_metrics)
        self._failure: str | None = None
        self._loading = False  # start() under way
        self._asleep = False
        self.release_timeout_s = config.lockstep.release_timeout_s

    @property
    def ready(self) -> bool:
        return self._scheduler is not None and self._scheduler.running

    @property
    def failure(self) -> str | None:
        return self._failure

    async def start(self) -> None:
        self._loading = True
        try:
            await self._serve()
        except (CheckpointError, WeightsError, ConfigError, EngineError) as exc:
            if isinstance(exc, ConfigError):
                self._failure = str(exc)
            elif isinstance(exc, EngineError):  # a setting the checkpoint refuses (the TTS's cfg_coef)
                self._failure = f"{self.stage}: {exc}"
            else:
                self._failure = f"invalid config field {self.weights_field!r}: {exc}"
            log.error("%s not serving: %s", self.stage, self._failure)
        except Exception as exc:  # kept and said: raised, it would die unseen with the start's task
            self._failure = build_failure(exc, self.sized_by)
            log.exception("%s not serving: %s", self.stage, self._failure)
        finally:
            self._loading = False

    @abstractmethod
    async def _serve(self) -> None:
        """Load the weights and start ``_scheduler`` (``start``, and a wake from sleep mode)."""

    @abstractmethod
    def _forget_model(self) -> None:
        """Drop the model ``_serve`` built (sleep mode), so its memory can go."""

    def _new_scheduler_registry(self) -> CollectorRegistry:
        """One per scheduler (a wake's would not register twice in one), shown in the server's."""
        metrics = CollectorRegistry()
        self._lockstep_metrics.follow(metrics)
        return metrics

    def _serving(self) -> LockstepScheduler:
        """The running scheduler a new stream takes a slot of, or the reason there is none."""
        if self._asleep:
            raise EngineError(self._asleep_message(), code=ENGINE_SLEEPING)
        if self._loading:
            raise EngineError(f"{self.speaks_of_itself} is still loading", code=ENGINE_UNAVAILABLE)
        scheduler = self._scheduler
        if scheduler is None or not scheduler.running:
            raise EngineError(self._failure or f"{self.speaks_of_itself} is not running", code=ENGINE_UNAVAILABLE)
        return scheduler

    def _asleep_message(self) -> str:
        return f"{self.speaks_of_itself} is asleep (sleep mode); POST /v1/omni/wakeup to wake it"

    async def stop(self) -> None:
        if self._scheduler is not None:
            await asyncio.to_thread(self._scheduler.stop, self.release_timeout_s)

    # ------------------------------------------------------------------ sleep mode (``SleepStage``)

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def release(self) -> None:
        self._asleep = True  # streams are refused from here on
        scheduler, self._scheduler = self._scheduler, None
        self._forget_model()
        if scheduler is not None:  # streams in flight end with engine_sleeping
            failure = EngineFailure(ENGINE_SLEEPING, self._asleep_message())
            await asyncio.to_thread(scheduler.stop, self.release_timeout_s, failure)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the weights, caches and CUDA graphs just dropped go back to the device

    async def restore(self) -> None:
        await self._serve()  # raises: the stage stays asleep
        self._asleep = False
