"""Kyutai-format safetensors -> this engine's modules, with errors that name the tensor.

Kyutai checkpoints store attention projections either stacked (``in_proj_weight``,
``out_proj.weight``: all per-step weight sets concatenated on dim 0, as published) or
split (``in_projs.{i}.weight``); both are accepted. Module paths differ from ours only in
wrapper names (``conv.conv``, ``gating``), mapped here in one place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from rtserve.engines.moshi.lm_config import CheckpointError

_STACKED = re.compile(r"^(?P<prefix>.*\.self_attn\.)(?P<kind>in_proj_weight|in_proj\.weight|out_proj\.weight)$")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"missing weight file {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None


def split_stacked(key: str, value: torch.Tensor, counts: Mapping[str, int]) -> list[tuple[str, torch.Tensor]]:
    """Expand one stacked attention projection (our naming) into ``in_projs.{i}`` / ``out_projs.{i}``."""
    match = _STACKED.match(key)
    if match is None:
        return [(key, value)]
    prefix = match["prefix"]
    mult = counts.get(prefix)
    if mult is None:
        return [(key, value)]  # reported as unexpected by the caller
    if value.shape[0] % mult:
        raise CheckpointError(
            f"tensor {key!r} has shape {tuple(value.shape)}: dim 0 is not a multiple of the {mult} per-step weight sets"
        )
    target = "in_projs" if match["kind"] != "out_proj.weight" else "out_projs"
    return [(f"{prefix}{target}.{i}.weight", part) for i, part in enumerate(value.view(mult, -1, *value.shape[1:]))]


def load_into(
    module: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    source: Path,
    rename: Callable[[str], str | None],
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """Copy every parameter of ``module`` from ``tensors`` (checkpoint names, mapped by
    ``rename``; None drops a key). Strict: a missing, extra or mis-shaped tensor is a
    ``CheckpointError`` naming it (by its name in the checkpoint)."""
    expected = dict(module.named_parameters())
    counts = {
        name[: -len("in_projs")]: len(child)
        for name, child in module.named_modules()
        if name.endswith("self_attn.in_projs") and isinstance(child, nn.ModuleList)
    }
    mapped: dict[str, tuple[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        renamed = rename(key)
        if renamed is None:
            continue
        for ours, part in split_stacked(renamed, value, counts):
            if ours not in expected:
                raise CheckpointError(f"{source.name}: unexpected tensor {key!r} (no such parameter in the model)")
            mapped[ours] = (key, part)
    missing = [name for name in expected if name not in mapped]
    if missing:
        raise CheckpointError(
            f"{source.name}: missing tensor for parameter {missing[0]!r}"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    with torch.no_grad():
        for name, param in expected.items():
            key, value = mapped[name]
            if tuple(value.shape) != tuple(param.shape):
                # RMSNorm alphas are stored [1, 1, dim] or [dim]; everything else must match exactly.
                if value.numel() == param.numel() and name.endswith(".alpha"):
                    value = value.reshape(param.shape)
                else:
                    raise CheckpointError(
                        f"{source.name}: tensor {key!r} has shape {tuple(value.shape)}, "
                        f"the config implies {tuple(param.shape)}"
                    )
            if not value.dtype.is_floating_point:
                raise CheckpointError(f"{source.name}: tensor {key!r} has dtype {value.dtype}, expected floats")
            param.data = value.to(dtype=dtype or param.dtype, device=param.device).clone()


def lm_rename(key: str) -> str | None:
    """Kyutai LM names -> ``MoshiLM`` names."""
    key = re.sub(r"\.gating\.(\d+)\.", r".mlp.\1.", key)  # depformer: per-step MLPs
    key = key.replace(".gating.", ".mlp.0.")
    return key


def mimi_rename(key: str) -> str | None:
    """Kyutai Mimi names -> ``Mimi`` names (codebook buffers are handled by the caller)."""
    if "._codebook." in key:
        return None
    key = re.sub(r"(\.conv)+\.weight$", ".weight", key)
    key = re.sub(r"(\.conv)+\.bias$", ".bias", key)
    key = re.sub(r"(\.convtr)+\.weight$", ".weight", key)
    key = re.sub(r"(\.convtr)+\.bias$", ".bias", key)
    key = re.sub(r"^(encoder|decoder)\.model\.", r"\1.", key)
    key = key.replace("_transformer.transformer.layers.", "_transformer.layers.")
    key = re.sub(r"\.layers\.(\d+)\.linear([12])\.", r".layers.\1.mlp.0.linear\2.", key)
    return key
