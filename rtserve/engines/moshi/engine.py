"""``--engine moshi``: resolve the weights (a folder or a hub repo, docs/engines.md#hub-weights),
build the frame model from ``moshi_engine`` config and wrap it in the lockstep runtime.

The weights resolve (downloading what the hub cache lacks) and load in ``start()``, on a thread
of their own, so the server answers ``/health`` meanwhile (``downloading``, then ``starting``).
Weights that cannot be found or fetched raise ``ConfigError`` there: the server exits 2.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.lockstep.session import LockstepSession, LockstepSessionEngine, lockstep_capabilities
from rtserve.engines.moshi import fused
from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.kv_budget import ensure_kv_fits, free_bytes
from rtserve.engines.moshi.lm_config import CheckpointError, MimiConfig
from rtserve.engines.moshi.loader import load_files, random_model
from rtserve.engines.moshi.paged_kv import paged_kv_spec
from rtserve.engines.moshi.sampling import MoshiSampling
from rtserve.engines.moshi.weights import resolve
from rtserve.engines.protocols import TurnEngines
from rtserve.engines.torch_device import resolve_device
from rtserve.engines.torch_dtypes import DTYPES
from rtserve.engines.values import SessionOptions
from rtserve.errors import ENGINE_UNAVAILABLE
from rtserve.weights import WeightsError
from rtserve.weights.source import WeightSource, open_source

FIELD = "moshi_engine.weights"
T = TypeVar("T")


def weight_source(config: ServerConfig) -> WeightSource | None:
    """Where the weights come from, checked without any network: set (unless random), a hub
    repo id or an existing folder. None: random weights at the published 7B shape."""
    settings = config.moshi_engine
    if not settings.weights:
        if settings.random_weights:
            return None
        raise ConfigError(
            f"invalid config field {FIELD!r}: the moshi engine needs weights: a local folder, "
            "hf://ORG/NAME[@REVISION] or ORG/NAME (--weights)"
        )
    try:
        source = open_source(settings.weights, FIELD, progress_interval_s=config.weights.progress_interval_s)
    except WeightsError as exc:
        raise ConfigError(f"invalid config field {FIELD!r}: {exc}") from None
    if source.folder is not None and not source.folder.is_dir():
        raise ConfigError(f"invalid config field {FIELD!r}: weight folder {source.folder} does not exist")
    return source


def build_frame_model(config: ServerConfig) -> MoshiFrameModel:
    """Resolve (maybe download) and load the weights; blocking."""
    settings = config.moshi_engine
    source = weight_source(config)
    device = resolve_device(settings.device, "moshi_engine.device")
    fused.set_enabled(settings.fuse_glue)
    try:
        files = None if source is None else resolve(source, config.weights, with_weights=not settings.random_weights)
        if files is None or settings.random_weights:
            loaded = random_model(files, device=device, dtype=DTYPES[settings.dtype])
        else:
            loaded = load_files(files, device=device, dtype=DTYPES[settings.dtype])
    except (CheckpointError, WeightsError) as exc:
        # Startup reports config problems as one line naming the field; keep the loader's detail.
        raise ConfigError(f"invalid config field {FIELD!r}: {exc}") from None
    sampling = MoshiSampling(
        use_sampling=settings.use_sampling,
        temperature=settings.temperature,
        top_k=settings.top_k,
        temperature_text=settings.temperature_text,
        top_k_text=settings.top_k_text,
    )
    loaded.mimi.encoder_to(DTYPES[settings.encoder_dtype])
    loaded.mimi.decoder_to(DTYPES[settings.decoder_dtype])
    voice_dir = settings.voice_dir or config.models.voice_prompt_dir or loaded.voices
    paged_kv = paged_kv_spec(settings, settings.batch_size, loaded.lm_config.context)
    dtype = DTYPES[settings.dtype]
    ensure_kv_fits("moshi_engine", loaded.lm_config, settings.batch_size, dtype, paged_kv, free_bytes(device))
    return MoshiFrameModel(
        loaded,
        settings.batch_size,
        sampling=sampling,
        voice_dir=voice_dir,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_voice_seconds=settings.max_voice_seconds,
        paged_kv=paged_kv,
        context_fill=settings.context_fill_frames,
    )


async def _on_own_thread(work: Callable[[], T]) -> T:
    """``work`` on a daemon thread: a download cannot be cancelled, and a server stopping
    mid-download must not wait for it (``asyncio.to_thread``'s pool is joined at exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():  # the server stopped while it ran
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]  # T when there was no error

    def run() -> None:
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, raised there
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="moshi-load", daemon=True).start()
    return await done


class MoshiSessionEngine:
    """The moshi ``SessionEngine``: declares its capabilities at once, loads in ``start()``,
    then serves through a ``LockstepSessionEngine`` over the loaded model."""

    def __init__(self, config: ServerConfig, registry: CollectorRegistry) -> None:
        weight_source(config)  # a missing setting or folder fails now, before the server listens
        self._config = config
        self._registry = registry
        mimi = MimiConfig.from_dict(None)  # every published Mimi: 24 kHz, 12.5 frames/s
        self.capabilities = lockstep_capabilities(
            "moshi",
            int(mimi.sample_rate / mimi.frame_rate),
            mimi.sample_rate,
            config.moshi_engine.batch_size,
            supports_text_output=True,
        )
        self.runtime: LockstepSessionEngine | None = None

    @property
    def ready(self) -> bool:
        return self.runtime is not None and self.runtime.ready

    async def start(self) -> None:
        model = await _on_own_thread(lambda: build_frame_model(self._config))
        runtime = LockstepSessionEngine("moshi", model, self._config, self._registry, supports_text_output=True)
        if runtime.capabilities != self.capabilities:
            raise ConfigError(
                f"invalid config field {FIELD!r}: its Mimi runs at {model.sample_rate} Hz in frames of "
                f"{model.frame_size} samples; the moshi engine serves 24000 Hz in frames of 1920"
            )
        self.runtime = runtime
        await runtime.start()

    async def open_session(self, session_id: str, options: SessionOptions) -> LockstepSession:
        if self.runtime is None:
            raise EngineError("engine moshi is not running", code=ENGINE_UNAVAILABLE)
        return await self.runtime.open_session(session_id, options)

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.stop()

    def model_ids(self) -> list[str]:
        return ["moshi"]

    def turn_engines(self) -> TurnEngines:
        return TurnEngines()  # one frame model, not separate turn engines

    def sleep_stages(self) -> tuple[()]:
        return ()  # the engine thread steps its model every tick: there is no idle model to unload


def create_engine(config: ServerConfig, registry: CollectorRegistry) -> MoshiSessionEngine:
    return MoshiSessionEngine(config, registry)
