"""Load a Moshi / PersonaPlex weight folder from local files only (no hub access, ever).

A folder holds ``config.json`` (Kyutai format: LM shape plus ``moshi_name``, ``mimi_name``,
``tokenizer_name`` and optionally ``mimi_config_name``), the LM safetensors, the Mimi
safetensors and the SentencePiece text tokenizer. Without ``config.json`` the published
Moshi 7B layout and file names are assumed. Every failure is a ``CheckpointError`` that
names the file, tensor or field at fault.

``random_model`` is for benchmarking only (``moshi_engine.random_weights``): the same modules
at a folder's shape (or the published 7B shape) with random weights and no tokenizer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece
import torch

from rtserve.engines.moshi.checkpoint import lm_rename, load_into, mimi_rename, read_safetensors
from rtserve.engines.moshi.lm import MoshiLM
from rtserve.engines.moshi.lm_config import CheckpointError, LMConfig, MimiConfig
from rtserve.engines.moshi.mimi import Mimi

log = logging.getLogger(__name__)

DEFAULT_NAMES = {
    "moshi_name": "model.safetensors",
    "mimi_name": "tokenizer-e351c8d8-checkpoint125.safetensors",
    "tokenizer_name": "tokenizer_spm_32k_3.model",
}
_CODEBOOK_EPS = 1e-5  # the published codebook normalisation: sum / max(usage, eps)


@dataclass
class LoadedModel:
    lm: MoshiLM
    mimi: Mimi
    tokenizer: sentencepiece.SentencePieceProcessor | None  # None: random weights (no text)
    lm_config: LMConfig
    mimi_config: MimiConfig
    folder: Path | None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _inside(folder: Path, name: object, field: str) -> Path:
    """A file named by config.json, which must stay inside the weight folder."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"config.json: {field} must be a file name")
    if name.startswith(("hf://", "http://", "https://")):
        raise CheckpointError(f"config.json: {field}={name!r} points at a hub; put the file in {folder} instead")
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise CheckpointError(f"config.json: {field}={name!r} leaves the weight folder")
    if not path.is_file():
        raise CheckpointError(f"missing file {path} (config.json {field})")
    return path


def _raw_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise CheckpointError(f"moshi weight folder {folder} does not exist")
    config_path = folder / "config.json"
    return _read_json(config_path) if config_path.is_file() else {}


def _shapes(folder: Path, raw: dict[str, Any]) -> tuple[LMConfig, MimiConfig]:
    mimi_raw = None
    if raw.get("mimi_config_name"):
        mimi_raw = _read_json(_inside(folder, raw["mimi_config_name"], "mimi_config_name"))
    return LMConfig.from_dict(raw), MimiConfig.from_dict(mimi_raw)


def read_configs(folder: Path) -> tuple[LMConfig, MimiConfig, dict[str, Path]]:
    raw = _raw_config(folder)
    names = {key: raw.get(key, default) for key, default in DEFAULT_NAMES.items()}
    files = {key: _inside(folder, value, key) for key, value in names.items()}
    return *_shapes(folder, raw), files


def load_lm(config: LMConfig, path: Path, device: torch.device, dtype: torch.dtype) -> MoshiLM:
    with torch.device("meta"):
        lm = MoshiLM(config)
    lm.to_empty(device=device)
    load_into(lm, read_safetensors(path), path, lm_rename, dtype=dtype)
    return lm.eval().requires_grad_(False)


def load_mimi(config: MimiConfig, codebooks: int, path: Path, device: torch.device) -> Mimi:
    mimi = Mimi(config, codebooks)
    tensors = read_safetensors(path)
    # Mimi always runs in fp32 (as the reference does): it is small and its codes are sensitive.
    load_into(mimi, tensors, path, mimi_rename, dtype=torch.float32)
    with torch.no_grad():
        for part, layers in (("rvq_first", 1), ("rvq_rest", codebooks - 1)):
            rvq = getattr(mimi.quantizer, part)
            for layer in range(layers):
                prefix = f"quantizer.{part}.vq.layers.{layer}._codebook."
                total, usage = tensors.get(prefix + "embedding_sum"), tensors.get(prefix + "cluster_usage")
                if total is None or usage is None:
                    missing = prefix + ("embedding_sum" if total is None else "cluster_usage")
                    raise CheckpointError(
                        f"{path.name}: missing tensor {missing!r} (the LM needs {codebooks} Mimi codebooks)"
                    )
                if tuple(total.shape) != tuple(rvq.codebooks.shape[1:]):
                    raise CheckpointError(
                        f"{path.name}: tensor {prefix + 'embedding_sum'!r} has shape "
                        f"{tuple(total.shape)}, the config implies {tuple(rvq.codebooks.shape[1:])}"
                    )
                rvq.codebooks[layer] = total.float() / usage.float().clamp(min=_CODEBOOK_EPS)[:, None]
    return mimi.to(device).eval().requires_grad_(False)


def load_tokenizer(path: Path, text_card: int) -> sentencepiece.SentencePieceProcessor:
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"{path} is not a SentencePiece model: {exc}") from None
    if processor.vocab_size() > text_card + 1:
        raise CheckpointError(
            f"{path.name}: tokenizer has {processor.vocab_size()} pieces, more than the LM's text_card={text_card}"
        )
    return processor


def load_folder(folder: str | Path, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    root = Path(folder)
    lm_config, mimi_config, files = read_configs(root)
    if mimi_config.bins != lm_config.card:
        raise CheckpointError(f"Mimi has {mimi_config.bins} bins per codebook but the LM card is {lm_config.card}")
    log.info("loading moshi LM from %s (%s, %s)", files["moshi_name"], device, dtype)
    lm = load_lm(lm_config, files["moshi_name"], device, dtype)
    mimi = load_mimi(mimi_config, lm_config.mimi_codebooks, files["mimi_name"], device)
    tokenizer = load_tokenizer(files["tokenizer_name"], lm_config.text_card)
    return LoadedModel(lm, mimi, tokenizer, lm_config, mimi_config, root)


def _randomize(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Matrices ~ N(0, 1/fan_in); norm weights and scales one; biases zero."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.dim() >= 2:
                std = (param.numel() // param.shape[0]) ** -0.5
                param.copy_(
                    torch.randn(param.shape, generator=generator, device=generator.device, dtype=param.dtype).mul_(std)
                )
            elif name.endswith(("alpha", "scale", "weight")):
                param.fill_(1.0)
            else:
                param.zero_()


def random_model(folder: str | Path | None, *, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """Benchmarking only: the LM and Mimi at ``folder``'s shape (its ``config.json`` and Mimi
    config; no weight files needed) or, with no folder, the published 7B shape, with random
    weights (seeded) and no tokenizer. What it says is noise; what it costs is the real model's."""
    root = None if folder is None else Path(folder)
    lm_config, mimi_config = (
        (LMConfig.from_dict({}), MimiConfig.from_dict(None)) if root is None else _shapes(root, _raw_config(root))
    )
    if mimi_config.bins != lm_config.card:
        raise CheckpointError(f"Mimi has {mimi_config.bins} bins per codebook but the LM card is {lm_config.card}")
    log.warning("moshi engine on RANDOM weights (moshi_engine.random_weights): benchmarking only")
    generator = torch.Generator(device=device).manual_seed(seed)  # drawn where the weights live: 7B is a lot
    with torch.device("meta"):
        lm = MoshiLM(lm_config)
    lm = lm.to(dtype).to_empty(device=device)
    _randomize(lm, generator)
    mimi = Mimi(mimi_config, lm_config.mimi_codebooks).to(device)
    _randomize(mimi, generator)
    with torch.no_grad():
        for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
            rvq.codebooks.copy_(torch.randn(rvq.codebooks.shape, generator=generator, device=device))
    return LoadedModel(
        lm.eval().requires_grad_(False), mimi.eval().requires_grad_(False), None, lm_config, mimi_config, root
    )
