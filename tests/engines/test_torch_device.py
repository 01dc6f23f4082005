"""A device setting that cannot be used here stops startup with an error naming that setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rtserve.config import ConfigError, load_config
from rtserve.engines.moshi.engine import build_frame_model
from rtserve.engines.torch_device import resolve_device


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the startup error where CUDA is missing")
def test_a_moshi_engine_on_missing_cuda_names_its_own_device_setting(tmp_path: Path) -> None:
    config = load_config(
        environ={"RTSERVE_MOSHI_ENGINE__DEVICE": "cuda", "RTSERVE_MOSHI_ENGINE__WEIGHTS": str(tmp_path)}
    )
    with pytest.raises(ConfigError) as caught:
        build_frame_model(config)
    message = str(caught.value)
    assert "'moshi_engine.device'" in message and "lockstep" not in message
    assert "torch.cuda.is_available() is False" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto means the CPU only where CUDA is missing")
def test_auto_is_the_cpu_where_torch_sees_no_gpu() -> None:
    assert resolve_device("auto", "image_engine.device") == torch.device("cpu")
