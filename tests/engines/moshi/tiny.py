"""A tiny random Moshi checkpoint written in Kyutai format, plus the reference models.

The reference ``moshi`` package (installed ``--no-deps`` in dev/CI) builds the models with
its own random initialisation; the weights are then saved the way Kyutai publishes them
(stacked attention projections) so our loader reads exactly what a real folder holds.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The reference compiles small kernels with torch.compile and CUDA-graphs its steps unless told not to.
os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("NO_CUDA_GRAPH", "1")

import torch
from safetensors.torch import save_file

TEXT_CARD = 64
CARD = 32

LM_KWARGS: dict[str, Any] = {
    "dim": 32,
    "text_card": TEXT_CARD,
    "existing_text_padding_id": 3,
    "n_q": 16,
    "dep_q": 8,
    "card": CARD,
    "num_heads": 4,
    "num_layers": 2,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 40,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 16,
    "depformer_dim_feedforward": int(4.125 * 16),
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}

MIMI_CONFIG: dict[str, Any] = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": {
        "channels": 1,
        "dimension": 16,
        "causal": True,
        "n_filters": 4,
        "n_residual_layers": 1,
        "activation": "ELU",
        "compress": 2,
        "dilation_base": 2,
        "disable_norm_outer_blocks": 0,
        "kernel_size": 7,
        "residual_kernel_size": 3,
        "last_kernel_size": 3,
        "norm": "none",
        "pad_mode": "constant",
        "ratios": [8, 6, 5, 4],
        "true_skip": True,
    },
    "quantizer": {"dimension": 8, "n_q": 8, "bins": CARD, "input_dimension": 16, "output_dimension": 16},
    "transformer": {
        "d_model": 16,
        "num_heads": 2,
        "num_layers": 2,
        "causal": True,
        "layer_scale": 0.01,
        "context": 20,
        "conv_layout": True,
        "max_period": 10000,
        "gating": "none",
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "dim_feedforward": 32,
        "input_dimension": 16,
        "output_dimensions": [16],
    },
}

SENTENCES = [
    "hello there how are you doing today",
    "i am fine thank you very much",
    "the weather is nice and sunny",
    "let us talk about music and books",
    "what would you like to know",
    "you are a helpful assistant",
    "moshi speaks and listens at the same time",
    "good morning good evening good night",
]


@dataclass
class TinyCheckpoint:
    folder: Path
    lm: Any  # moshi.models.lm.LMModel
    mimi: Any  # moshi.models.compression.MimiModel


def stack_attention(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``in_projs.{i}.weight`` -> one stacked ``in_proj_weight`` (self- and cross-attention), as
    Kyutai publishes."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in state.items():
        for kind in ("self_attn", "cross_attention"):
            for split, stacked in (
                (f".{kind}.in_projs.", f".{kind}.in_proj_weight"),
                (f".{kind}.out_projs.", f".{kind}.out_proj.weight"),
            ):
                if split in key:
                    prefix, rest = key.split(split)
                    groups.setdefault(prefix + stacked, {})[int(rest.split(".")[0])] = value
                    break
            else:
                continue
            break
        else:
            out[key] = value.contiguous()
    for key, parts in groups.items():
        out[key] = torch.cat([parts[i] for i in sorted(parts)], dim=0).contiguous()
    return out


def save_kyutai_folder(
    folder: Path, lm: Any, mimi: Any, *, config: dict[str, Any], mimi_config: dict[str, Any]
) -> None:
    """``lm`` and ``mimi`` (reference modules) as Kyutai publishes a checkpoint folder: stacked
    attention projections, Mimi's config, a small trained SentencePiece tokenizer, and
    ``config.json`` (``config`` with the files' names)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(stack_attention({k: v.cpu() for k, v in lm.state_dict().items()}), str(folder / "model.safetensors"))
    save_file(stack_attention(mimi.state_dict()), str(folder / "mimi.safetensors"))
    (folder / "mimi_config.json").write_text(json.dumps(mimi_config))
    train_tokenizer(folder / "tokenizer.model")
    names = {
        "moshi_name": "model.safetensors",
        "mimi_name": "mimi.safetensors",
        "tokenizer_name": "tokenizer.model",
        "mimi_config_name": "mimi_config.json",
    }
    (folder / "config.json").write_text(json.dumps({**config, **names}))


def reference_lm(lm_kwargs: dict[str, Any] = LM_KWARGS, seed: int = 0) -> Any:
    from moshi.models.lm import LMModel

    torch.manual_seed(seed)
    model = LMModel(**lm_kwargs).float().eval()
    # The reference init leaves norms at one and attention projections at PyTorch's default;
    # perturb every parameter a little so no weight is trivially symmetric.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return model


def reference_mimi(mimi_config: dict[str, Any] = MIMI_CONFIG, seed: int = 1) -> Any:
    from moshi.models.loaders import get_mimi

    torch.manual_seed(seed)
    mimi = get_mimi(None, copy.deepcopy(mimi_config), num_codebooks=8)
    with torch.no_grad():
        for name, param in mimi.named_parameters():
            if "layer_scale" in name:
                param.fill_(0.3)
            elif param.dim() > 1:
                param.add_(0.02 * torch.randn_like(param))
        for name, buf in mimi.named_buffers():
            if name.endswith("embedding_sum"):
                buf.copy_(torch.randn_like(buf) * 3.0)
            elif name.endswith("cluster_usage"):
                buf.copy_(torch.rand_like(buf) * 2 + 1.0)
            elif name.endswith("_initialized"):
                buf.fill_(1.0)
        for module in mimi.modules():  # drop cached codebooks computed from the old buffers
            if hasattr(module, "_embedding"):
                module.register_buffer("_embedding", None, persistent=False)
    return mimi.eval()


def train_tokenizer(path: Path, vocab_size: int = TEXT_CARD) -> None:
    import sentencepiece as spm

    corpus = path.with_suffix(".txt")
    corpus.write_text("\n".join(SENTENCES * 4) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(path.with_suffix("")),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        user_defined_symbols=["<system>"],
        minloglevel=2,
        hard_vocab_limit=False,
    )
    corpus.unlink()


def write_checkpoint(
    folder: Path, *, lm_kwargs: dict[str, Any] = LM_KWARGS, mimi_config: dict[str, Any] = MIMI_CONFIG
) -> TinyCheckpoint:
    lm = reference_lm(lm_kwargs)
    mimi = reference_mimi(mimi_config)
    save_kyutai_folder(folder, lm, mimi, config=dict(lm_kwargs, model_type="moshi"), mimi_config=mimi_config)
    return TinyCheckpoint(folder, lm, mimi)
