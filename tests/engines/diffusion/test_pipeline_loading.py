"""``image_engine.weights`` as a hub repo id without the network: the tiny pipeline in a hub
cache written in huggingface_hub's layout, read offline; a repo the cache lacks fails with one
line naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants

from rtserve.config import DiffusionEngineConfig, ServerConfig
from rtserve.engines.diffusion.loading import load_pipeline
from rtserve.weights import WeightsError
from tests.weights.hub_support import folder_files, write_cache

REPO = "tiny-org/tiny-sd"


@pytest.fixture
def offline_cache(tmp_path: Path, tiny_sd_folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    write_cache(cache, REPO, folder_files(tiny_sd_folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _load(weights: str, config: ServerConfig) -> Any:
    return load_pipeline(DiffusionEngineConfig(weights=weights, device="cpu"), "image_engine.weights", config)


@pytest.mark.parametrize("weights", [REPO, f"hf://{REPO}"])
def test_a_hub_repo_id_loads_from_the_cache(offline_cache: Path, config: ServerConfig, weights: str) -> None:
    pipe = _load(weights, config)
    assert type(pipe).__name__ == "StableDiffusionPipeline"
    assert str(offline_cache) in str(pipe.unet.config._name_or_path)  # the snapshot, not a download


def test_a_local_folder_loads(tiny_sd_folder: Path, config: ServerConfig) -> None:
    assert _load(str(tiny_sd_folder), config).unet.config.in_channels == 4


def test_missing_weights_fail_in_one_line(offline_cache: Path, config: ServerConfig, tmp_path: Path) -> None:
    with pytest.raises(WeightsError) as missing:
        _load("tiny-org/not-cached", config)
    assert "hf://tiny-org/not-cached" in str(missing.value) and "HF_HUB_OFFLINE" in str(missing.value)
    assert "\n" not in str(missing.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError) as no_index:
        _load(str(tmp_path / "empty"), config)
    assert "model_index.json" in str(no_index.value)
