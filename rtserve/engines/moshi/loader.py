"""Load a Moshi / PersonaPlex checkpoint: a local folder or a hub repo (docs/engines.md#hub-weights).

``weights.py`` says which files make a checkpoint (``config.json`` in Kyutai format: LM shape
plus ``moshi_name``, ``mimi_name``, ``tokenizer_name`` and optionally ``mimi_config_name``; the
published Moshi 7B layout and file names without it) and ``rtserve.weights`` finds or downloads
them. Every failure here is a ``CheckpointError`` that names the file, tensor or field at fault.

``random_model`` is for benchmarking only (``moshi_engine.random_weights``): the same modules
at a checkpoint's shape (or the published 7B shape) with random weights and no tokenizer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece
import torch

from rtserve.config import WeightsConfig
from rtserve.engines.model_builds import MODEL_BUILDS
from rtserve.engines.moshi.checkpoint import lm_rename, load_into, mimi_rename, read_safetensors
from rtserve.engines.moshi.lm import MoshiLM
from rtserve.engines.moshi.lm_config import CheckpointError, LMConfig, MimiConfig
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.weights import CheckpointExtras, MoshiFiles, resolve
from rtserve.weights import WeightsError
from rtserve.weights.source import WeightSource

log = logging.getLogger(__name__)

_CODEBOOK_EPS = 1e-5  # the published codebook normalisation: sum / max(usage, eps)


@dataclass
class LoadedModel:
    lm: MoshiLM
    mimi: Mimi
    tokenizer: sentencepiece.SentencePieceProcessor | None  # None: random weights (no text)
    lm_config: LMConfig
    mimi_config: MimiConfig
    folder: Path | None
    extras: CheckpointExtras = field(default_factory=CheckpointExtras)  # model_type, lm_gen_config, stt_config
    voices: Path | None = None  # the checkpoint's own voice prompts (PersonaPlex voices.tgz, unpacked)


def shapes(files: MoshiFiles) -> tuple[LMConfig, MimiConfig]:
    lm_config, mimi_config = LMConfig.from_dict(files.raw), MimiConfig.from_dict(files.mimi_raw)
    if mimi_config.bins != lm_config.card:
        raise CheckpointError(f"Mimi has {mimi_config.bins} bins per codebook but the LM card is {lm_config.card}")
    return lm_config, mimi_config


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


def load_files(files: MoshiFiles, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    assert files.weights is not None  # resolved with weights
    lm_config, mimi_config = shapes(files)
    log.info("loading moshi LM from %s (%s, %s)", files.weights["moshi_name"], device, dtype)
    with MODEL_BUILDS:  # its modules make tensors in torch's default dtype
        lm = load_lm(lm_config, files.weights["moshi_name"], device, dtype)
        mimi = load_mimi(mimi_config, lm_config.mimi_codebooks, files.weights["mimi_name"], device)
    tokenizer = load_tokenizer(files.weights["tokenizer_name"], lm_config.text_card)
    return LoadedModel(lm, mimi, tokenizer, lm_config, mimi_config, files.folder, files.extras, files.voices)


def load_folder(folder: str | Path, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A local weight folder (nothing is downloaded unless its config names hf:// files)."""
    source = WeightSource(Path(folder), "moshi_engine.weights", progress_interval_s=WeightsConfig().progress_interval_s)
    try:
        files = resolve(source, WeightsConfig())
    except WeightsError as exc:
        raise CheckpointError(str(exc)) from None
    return load_files(files, device=device, dtype=dtype)


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


def random_model(files: MoshiFiles | None, *, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """Benchmarking only: the LM and Mimi at the shape of ``files`` (its ``config.json`` and
    Mimi config; no weight files needed) or, with none, the published 7B shape, with random
    weights (seeded) and no tokenizer. What it says is noise; what it costs is the real model's."""
    if files is None:
        lm_config, mimi_config = LMConfig.from_dict({}), MimiConfig.from_dict(None)
    else:
        lm_config, mimi_config = shapes(files)
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
        lm.eval().requires_grad_(False),
        mimi.eval().requires_grad_(False),
        None,
        lm_config,
        mimi_config,
        None if files is None else files.folder,
        CheckpointExtras() if files is None else files.extras,
    )
