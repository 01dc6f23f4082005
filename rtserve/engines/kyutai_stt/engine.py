"""The Kyutai STT engine: weights -> ``SttFrameModel`` on its own lockstep scheduler, and the
streams clients open on it (docs/engines.md#kyutai-stt-engine).

Configured by ``stt_engine`` (``weights`` set); the weights resolve (maybe downloading) and
load in ``start()``, on a thread, so the server answers meanwhile (streams are refused with
``engine_unavailable`` until then, and for good if loading failed).

Its scheduler keeps every sample a client sends: no latency trimming (a transcript must not
lose speech to save 80 ms), and a backlog of ``stt_engine.max_buffered_s`` (clients may send
faster than real time). Its lockstep metrics live in a registry of its own (the realtime
engine may be lockstep too) and show in the server's as ``rtserve_kyutai_stt_*``.

A server runs one copy: the engine set builds it (or takes the cascade's) and workers reach
it over the engine link (docs/engines.md#kyutai-stt-engine). It is a sleep stage
(docs/serving.md#sleep-mode): asleep, its scheduler stops (streams end with ``engine_sleeping``)
and its weights and caches are dropped; a wake loads them again.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_stt.loader import SttModel, load_stt
from rtserve.engines.kyutai_stt.stream import SttStream
from rtserve.engines.kyutai_stt.words import WordTracker
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.engines.moshi.kv_budget import ensure_kv_fits, free_bytes
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.engines.moshi.paged_kv import paged_kv_spec
from rtserve.engines.scheduled_engine import ScheduledEngine
from rtserve.engines.torch_device import resolve_device
from rtserve.engines.torch_dtypes import DTYPES
from rtserve.engines.values import SlotPrompt
from rtserve.weights.source import open_source

log = logging.getLogger(__name__)

FIELD = "stt_engine.weights"
METRICS_PREFIX = "rtserve_kyutai_stt_"


class KyutaiSttEngine(ScheduledEngine):
    stage = "stt_engine"
    weights_field = FIELD
    sized_by = "stt_engine.batch_size and flush_rows"
    speaks_of_itself = "the speech-to-text engine"

    def __init__(
        self, config: ServerConfig, model: SttModel | None = None, *, registry: CollectorRegistry | None = None
    ) -> None:
        """``model``: already loaded (tests); otherwise ``start`` loads ``stt_engine.weights``.
        ``registry``: the server's, where its scheduler's metrics show."""
        super().__init__(config, registry, METRICS_PREFIX)
        self._given = model
        self._model: SttModel | None = None
        self.sample_rate = 24000 if model is None else model.loaded.mimi_config.sample_rate

    async def _serve(self) -> None:
        """Load the weights and start stepping (``start``, and a wake from sleep mode)."""
        settings = self._config.stt_engine
        model = self._given if self._given is not None else await asyncio.to_thread(self._load)
        # Off the event loop: the batch's KV and CUDA graphs take seconds to build, and on a wake from
        # sleep mode the loop is serving the process's other engines' sessions meanwhile.
        frame_model = await asyncio.to_thread(self._frame_model, model)
        self._model = model
        self.sample_rate = model.loaded.mimi_config.sample_rate
        lockstep = self._config.lockstep.model_copy(
            update={
                "max_input_backlog_ms": settings.max_buffered_s * 1000,
                "latency_trim_window_frames": None,
                "underrun_repay_ms": 0.0,
            }
        )
        self._scheduler = LockstepScheduler(
            frame_model,
            lockstep,
            self._new_scheduler_registry(),
            name="kyutai_stt",
            drains=frame_model if settings.drain_waiting_input else None,
            drain_after_ticks=settings.drain_after_ticks,
            late_input_grace_ticks=settings.late_input_grace_ticks,
            flush_between_ticks=settings.flush_between_ticks,
            drain_room=settings.drain_room,
        )
        self._scheduler.start()
        log.info("kyutai stt engine serving %d streams", settings.batch_size)

    def _frame_model(self, model: SttModel) -> SttFrameModel:
        """The batch over ``model`` (blocking: its KV, and its CUDA graphs on a GPU)."""
        settings = self._config.stt_engine
        model.loaded.mimi.encoder_to(DTYPES[settings.codec_dtype])
        config, weight = model.loaded.lm_config, next(model.loaded.lm.parameters())
        paged_kv = paged_kv_spec(settings, settings.batch_size, config.context)
        ensure_kv_fits("stt_engine", config, settings.batch_size, weight.dtype, paged_kv, free_bytes(weight.device))
        return SttFrameModel(
            model,
            settings.batch_size,
            temperature=settings.temperature,
            paged_kv=paged_kv,
            drains=settings.drain_waiting_input,
            flush_rows=settings.flush_rows,
        )

    def _load(self) -> SttModel:
        settings = self._config.stt_engine
        if not settings.weights:
            raise CheckpointError("not set")
        source = open_source(settings.weights, FIELD, progress_interval_s=self._config.weights.progress_interval_s)
        device = resolve_device(settings.device, "stt_engine.device")
        return load_stt(source, self._config.weights, device=device, dtype=DTYPES[settings.dtype])

    def _forget_model(self) -> None:
        self._model = None

    async def open_stream(self, stream_id: str) -> SttStream:
        scheduler, model = self._serving(), self._model
        assert model is not None  # set with the scheduler, dropped with it
        lease = scheduler.acquire(SlotPrompt(), session_id=stream_id)
        config = model.loaded.lm_config
        tracker = WordTracker(
            model.settings, model.tokenizer.decode, config.text_padding_id, config.text_end_padding_id
        )
        return SttStream(lease, model.settings, tracker, scheduler.frame_size)
