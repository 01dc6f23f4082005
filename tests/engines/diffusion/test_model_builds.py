"""Loads in one process build one at a time (docs/engines.md#one-model-build-at-a-time): diffusers
makes its dtype torch's process-wide default while it builds, so a pipeline loading in bfloat16
beside another load must neither leave that default behind nor hand it to the other model.

diffusers' window is widened (a pause after it sets the default) so that, without the lock, the
loads below overlap inside it on every run."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import ModelMixin

from rtserve.config import DiffusionEngineConfig, ServerConfig
from rtserve.engines.diffusion.loading import load_pipeline
from rtserve.engines.kyutai_tts.loader import load_folder
from tests.engines.kyutai_tts.tiny import write_tts_checkpoint

PAUSE_S = 0.2


@pytest.fixture
def slow_dtype_switch(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """diffusers pauses after making its dtype the default; the event is set at the first switch."""
    switched = threading.Event()
    original = ModelMixin._set_default_torch_dtype.__func__

    def pausing(cls: Any, dtype: torch.dtype) -> torch.dtype:
        found = original(cls, dtype)
        switched.set()
        time.sleep(PAUSE_S)
        return found

    monkeypatch.setattr(ModelMixin, "_set_default_torch_dtype", classmethod(pausing))
    return switched


def _load_bf16(folder: Path, config: ServerConfig) -> Any:
    settings = DiffusionEngineConfig(weights=str(folder), device="cpu", dtype="bfloat16")
    return load_pipeline(settings, "image_engine.weights", config)


def test_two_bfloat16_pipelines_at_once_leave_float32_the_default(
    tiny_sd_folder: Path, config: ServerConfig, slow_dtype_switch: threading.Event
) -> None:
    loads = [threading.Thread(target=_load_bf16, args=(tiny_sd_folder, config)) for _ in range(2)]
    try:
        for load in loads:
            load.start()
            slow_dtype_switch.wait(10)  # the second starts inside the first one's switch
        for load in loads:
            load.join(60)
        assert torch.get_default_dtype() == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)  # a failure here must not spill into other tests


def test_a_kyutai_model_loading_beside_a_pipeline_is_all_float32(
    tiny_sd_folder: Path, config: ServerConfig, slow_dtype_switch: threading.Event, tmp_path: Path
) -> None:
    tiny = write_tts_checkpoint(tmp_path / "tts")
    pipeline = threading.Thread(target=_load_bf16, args=(tiny_sd_folder, config))
    try:
        pipeline.start()
        assert slow_dtype_switch.wait(10)
        loaded = load_folder(tiny.folder, device=torch.device("cpu"), dtype=torch.float32)
        pipeline.join(60)
    finally:
        torch.set_default_dtype(torch.float32)
    tensors = [
        (name, tensor.dtype)
        for module in (loaded.lm, loaded.conditioners, loaded.mimi)
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]
        if tensor.is_floating_point()
    ]
    assert tensors
    assert [(name, dtype) for name, dtype in tensors if dtype != torch.float32] == []
