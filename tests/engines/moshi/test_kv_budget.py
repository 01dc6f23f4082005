"""A KV state that cannot fit the device is refused before allocation, naming the field to change
and a size that fits (rtserve/engines/moshi/kv_budget.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from rtserve.config import ConfigError, KvCacheSection, ServerConfig
from rtserve.engines.moshi import engine as moshi_engine
from rtserve.engines.moshi.kv_budget import GIB, ensure_kv_fits, kv_state_bytes
from rtserve.engines.moshi.lm_config import LMConfig
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.paged_kv import paged_kv_spec

SEVEN_B = LMConfig.from_dict({})  # the published 7B shape: 32 layers of 4096, context 3000


def _allocated(caches: list[Any]) -> int:
    """Bytes of every layer's keys, values and scales (not the block table all layers share)."""
    tensors = [t for cache in caches for name, t in vars(cache).items() if name != "table" and torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("kv_cache", ["ring", "paged_int8", "paged_int4"])
def test_the_counted_bytes_are_what_the_transformer_allocates(loaded: LoadedModel, kv_cache: str) -> None:
    transformer, config = loaded.lm.transformer, loaded.lm_config
    spec = paged_kv_spec(KvCacheSection(kv_cache=kv_cache, kv_block_frames=8, kv_pool_frames=100), 3, config.context)
    transformer.use_paged_kv(spec)
    try:
        transformer.start(3, torch.device("cpu"), torch.float32)
        assert _allocated(transformer.caches) == kv_state_bytes(config, 3, torch.float32, spec)
    finally:
        transformer.use_paged_kv(None)


def test_a_pool_that_cannot_fit_names_kv_pool_frames_and_the_size_that_does() -> None:
    free = 120 * GIB
    null_pool = paged_kv_spec(KvCacheSection(kv_cache="paged_int8"), 256, SEVEN_B.context)
    with pytest.raises(ConfigError, match=r"'moshi_engine\.kv_pool_frames'.*768000 frames.*193\.\d GiB") as refused:
        ensure_kv_fits("moshi_engine", SEVEN_B, 256, torch.bfloat16, null_pool, free)
    fit = int(str(refused.value).rsplit("at most ", 1)[1].split()[0])
    assert 400_000 < fit < 480_000  # 120 GiB / 270,336 bytes a frame
    fitting = paged_kv_spec(KvCacheSection(kv_cache="paged_int8", kv_pool_frames=fit), 256, SEVEN_B.context)
    assert fitting is not None
    ensure_kv_fits("moshi_engine", SEVEN_B, 256, torch.bfloat16, fitting, free)
    bigger = dataclasses.replace(fitting, num_blocks=fitting.num_blocks + 1)
    with pytest.raises(ConfigError):
        ensure_kv_fits("moshi_engine", SEVEN_B, 256, torch.bfloat16, bigger, free)


def test_rings_that_cannot_fit_name_batch_size_and_the_batch_that_does() -> None:
    with pytest.raises(ConfigError, match=r"'stt_engine\.batch_size': 256 rings of 3000 frames of bfloat16") as refused:
        ensure_kv_fits("stt_engine", SEVEN_B, 256, torch.bfloat16, None, 100 * GIB)
    fit = int(str(refused.value).rsplit("at most ", 1)[1].split()[0])
    ensure_kv_fits("stt_engine", SEVEN_B, fit, torch.bfloat16, None, 100 * GIB)
    with pytest.raises(ConfigError):
        ensure_kv_fits("stt_engine", SEVEN_B, fit + 1, torch.bfloat16, None, 100 * GIB)


def test_without_a_measured_device_nothing_is_refused() -> None:
    ensure_kv_fits("moshi_engine", SEVEN_B, 10_000, torch.bfloat16, None, None)


def test_the_moshi_engine_refuses_a_pool_larger_than_the_device_before_allocating_it(
    moshi_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(moshi_engine, "free_bytes", lambda device: 1024)
    settings = moshi_config.moshi_engine.model_copy(update={"kv_cache": "paged_int8"})
    with pytest.raises(ConfigError, match=r"moshi_engine\.kv_pool_frames.*at most 0 frames fit"):
        moshi_engine.build_frame_model(moshi_config.model_copy(update={"moshi_engine": settings}))
