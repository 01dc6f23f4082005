"""``--engine moshi``: build the frame model from ``moshi_engine`` config and wrap it in the lockstep runtime."""

from __future__ import annotations

import torch
from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.lockstep.session import LockstepSessionEngine
from rtserve.engines.moshi import fused
from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.engines.moshi.loader import load_folder, random_model
from rtserve.engines.moshi.paged_kv import PagedKVSpec
from rtserve.engines.moshi.sampling import MoshiSampling
from rtserve.engines.tiny_torch import resolve_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_frame_model(config: ServerConfig) -> MoshiFrameModel:
    settings = config.moshi_engine
    if not settings.weights and not settings.random_weights:
        raise ConfigError(
            "invalid config field 'moshi_engine.weights': the moshi engine needs a local weight "
            "folder (config.json, model and Mimi safetensors, tokenizer); nothing is downloaded"
        )
    device = resolve_device(settings.device)
    fused.set_enabled(settings.fuse_glue)
    try:
        if settings.random_weights:
            loaded = random_model(settings.weights, device=device, dtype=DTYPES[settings.dtype])
        else:
            assert settings.weights  # checked above: without random weights a folder is required
            loaded = load_folder(settings.weights, device=device, dtype=DTYPES[settings.dtype])
    except CheckpointError as exc:
        # Startup reports config problems as one line naming the field; keep the loader's detail.
        raise ConfigError(f"invalid config field 'moshi_engine.weights': {exc}") from None
    sampling = MoshiSampling(
        use_sampling=settings.use_sampling,
        temperature=settings.temperature,
        top_k=settings.top_k,
        temperature_text=settings.temperature_text,
        top_k_text=settings.top_k_text,
    )
    voice_dir = settings.voice_dir or config.models.voice_prompt_dir
    paged_kv = None
    if settings.kv_cache == "paged_int8":
        block = settings.kv_block_frames
        frames = settings.kv_pool_frames or settings.batch_size * loaded.lm_config.context
        paged_kv = PagedKVSpec(num_blocks=-(-frames // block), block_size=block)
    return MoshiFrameModel(
        loaded,
        settings.batch_size,
        sampling=sampling,
        voice_dir=voice_dir,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_voice_seconds=settings.max_voice_seconds,
        paged_kv=paged_kv,
    )


def create_engine(config: ServerConfig, registry: CollectorRegistry) -> LockstepSessionEngine:
    model = build_frame_model(config)
    return LockstepSessionEngine("moshi", model, config, registry, supports_text_output=True)
