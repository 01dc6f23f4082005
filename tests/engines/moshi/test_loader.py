"""Loader errors name the file, tensor or field at fault; no hub access is ever attempted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file, save_file

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.moshi.engine import build_frame_model
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.engines.moshi.loader import load_folder

CPU = torch.device("cpu")


@pytest.fixture
def copy(weights: Path, tmp_path: Path) -> Path:
    target = tmp_path / "w"
    shutil.copytree(weights, target)
    return target


def _edit(path: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_missing_lm_tensor_is_named(copy: Path) -> None:
    _edit(copy / "model.safetensors", lambda t: t.pop("out_norm.alpha"))
    with pytest.raises(CheckpointError, match=r"model.safetensors: missing tensor for parameter 'out_norm.alpha'"):
        load_folder(copy, device=CPU, dtype=torch.float32)


def test_mismatched_shape_names_tensor_and_shapes(copy: Path) -> None:
    def shrink(t: dict[str, torch.Tensor]) -> None:
        t["text_linear.weight"] = t["text_linear.weight"][:10]

    _edit(copy / "model.safetensors", shrink)
    with pytest.raises(
        CheckpointError, match=r"'text_linear.weight' has shape \(10, 32\), the config implies \(64, 32\)"
    ):
        load_folder(copy, device=CPU, dtype=torch.float32)


def test_unexpected_tensor_is_named(copy: Path) -> None:
    def add(t: dict[str, torch.Tensor]) -> None:
        t["transformer.layers.9.norm1.alpha"] = torch.ones(1, 1, 32)

    _edit(copy / "model.safetensors", add)
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'transformer.layers.9.norm1.alpha'"):
        load_folder(copy, device=CPU, dtype=torch.float32)


def test_missing_mimi_codebook_is_named(copy: Path) -> None:
    def drop(t: dict[str, torch.Tensor]) -> None:
        t.pop("quantizer.rvq_rest.vq.layers.6._codebook.embedding_sum")

    _edit(copy / "mimi.safetensors", drop)
    with pytest.raises(CheckpointError, match=r"rvq_rest.vq.layers.6._codebook.embedding_sum"):
        load_folder(copy, device=CPU, dtype=torch.float32)


def test_missing_file_and_hub_names_are_refused(copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (copy / "tokenizer.model").unlink()
    with pytest.raises(CheckpointError, match=r"missing file .*tokenizer.model \(config.json tokenizer_name\)"):
        load_folder(copy, device=CPU, dtype=torch.float32)
    # A name in another repo is fetched from the hub: offline, with an empty cache, it is named.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(config, moshi_name="hf://kyutai/moshiko/model.safetensors")))
    with pytest.raises(CheckpointError, match=r"hf://kyutai/moshiko: model.safetensors is not in the hub cache"):
        load_folder(copy, device=CPU, dtype=torch.float32)
    (copy / "config.json").write_text(json.dumps(dict(config, moshi_name="../../etc/passwd")))
    with pytest.raises(CheckpointError, match="leaves the weight folder"):
        load_folder(copy, device=CPU, dtype=torch.float32)


def test_unsupported_architecture_option_is_refused(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(dict(config, norm_emb=True)))
    with pytest.raises(CheckpointError, match="norm_emb=True is not supported"):
        load_folder(copy, device=CPU, dtype=torch.float32)


def test_engine_config_errors_name_the_field(config: ServerConfig, copy: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"'moshi_engine.weights': the moshi engine needs weights: a local folder, hf://"
    ):
        build_frame_model(config)
    broken = config.model_copy(
        update={"moshi_engine": config.moshi_engine.model_copy(update={"weights": str(copy / "nowhere")})}
    )
    with pytest.raises(ConfigError, match=r"moshi_engine.weights.*does not exist"):
        build_frame_model(broken)


@pytest.mark.parametrize("workers", [1, 2])  # 2: the engine process refuses it; the supervisor stops
@pytest.mark.parametrize("weights", [None, "nowhere"])
def test_serve_with_unusable_weights_exits_at_startup_with_one_line(
    tmp_path: Path, weights: str | None, workers: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    if weights is not None:
        env["RTSERVE_MOSHI_ENGINE__WEIGHTS"] = str(tmp_path / weights)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtserve.cli",
            "serve",
            "--engine",
            "moshi",
            "--workers",
            str(workers),
            "--port",
            "0",
            "--log-level",
            "error",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'moshi_engine.weights'" in lines[0], out.stderr
