"""Whether a temporal transformer's KV state fits its device, checked before it is allocated.

The state is allocated one layer at a time when the engine starts. One that cannot fit fails
part-way with a CUDA out-of-memory error after the weights have loaded (a minute for a 7B model),
and the server stays up answering ``/health`` with that error. A configuration that can never
fit is refused instead, before the first layer, naming the field to change and the size that fits
(docs/engines.md#paged-int8-kv). Only what certainly cannot fit is refused: activations and CUDA
graphs still need their share of what remains.
"""

from __future__ import annotations

import torch

from rtserve.config import ConfigError
from rtserve.engines.moshi.lm_config import LMConfig
from rtserve.engines.moshi.paged_kv import PagedKVSpec

GIB = 1024**3


def kv_state_bytes(model: LMConfig, batch_size: int, dtype: torch.dtype, paged: PagedKVSpec | None) -> int:
    """Device bytes of the temporal KV: a ring per slot, or the shared pool with its scratch block."""
    if paged is None:
        return batch_size * model.context * _ring_frame_bytes(model, dtype)
    return (paged.num_blocks + 1) * _block_bytes(model, paged)


def free_bytes(device: torch.device) -> int | None:
    """Memory free on a CUDA device now (other processes' use included); None elsewhere."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def ensure_kv_fits(
    section: str,
    model: LMConfig,
    batch_size: int,
    dtype: torch.dtype,
    paged: PagedKVSpec | None,
    free: int | None,
) -> None:
    """``ConfigError`` naming ``section``'s field to change when the KV state needs more than
    ``free`` bytes (None: not checked)."""
    need = kv_state_bytes(model, batch_size, dtype, paged)
    if free is None or need <= free:
        return
    shortfall = f"needs {need / GIB:.1f} GiB and {free / GIB:.1f} GiB of the device is free after the weights"
    if paged is None:
        fit = free // (model.context * _ring_frame_bytes(model, dtype))
        raise ConfigError(
            f"invalid config field '{section}.batch_size': {batch_size} rings of {model.context} frames of "
            f"{str(dtype).removeprefix('torch.')} KV {shortfall}; at most {fit} fit (kv_cache: paged_int8 "
            "stores half the bytes a frame, and only the frames each conversation has reached)"
        )
    fit = max(free // _block_bytes(model, paged) - 1, 0) * paged.block_size  # less the scratch block
    raise ConfigError(
        f"invalid config field '{section}.kv_pool_frames': a pool of {paged.num_blocks * paged.block_size} "
        f"frames ({paged.bits}-bit; null is batch_size x the model's context of {model.context}) {shortfall}; "
        f"at most {fit} frames fit"
    )


def _ring_frame_bytes(model: LMConfig, dtype: torch.dtype) -> int:
    return model.num_layers * 2 * model.dim * dtype.itemsize


def _block_bytes(model: LMConfig, paged: PagedKVSpec) -> int:
    head_dim = model.dim // model.num_heads
    return paged.block_size * PagedKVSpec.bytes_per_frame(model.num_layers, model.num_heads, head_dim, paged.bits)
