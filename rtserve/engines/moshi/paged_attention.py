"""Single-query attention over paged 8-bit or 4-bit KV (``PagedKVCache``) and the quantize-and-store of
each step's keys and values, as Triton kernels (CUDA).

Programs per (row, head, chunk of ring slots) walk only the blocks the row has reached (at
most ``span`` ring slots), dequantize keys and values in registers and keep an online softmax
that a second kernel merges across chunks: the KV
bytes read are 1 (or 1/2) per element plus one scale per (frame, head), instead of 2 for bf16,
and nothing is materialised. The visibility rule is ``StepPlan``'s (ring slot -> absolute
position from the row's offset, window ``context``) plus the row's ``floor``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from rtserve.engines.moshi.paged_kernels import merge_kernel, partial_kernel, write_kernel

if TYPE_CHECKING:
    from rtserve.engines.moshi.paged_kv import PagedKVCache

# No window: larger than any position difference.
NO_WINDOW = 2**62


# Ring slots one program reads (split-K / flash-decoding: more programs in flight than
# rows x heads alone give); a second kernel merges the splits' partial softmaxes.
# Measured on an H200 (benchmarks/moshi_paged_kernel.py, benchmarks/notes/moshi_speed.md): one warp per
# program and 32-slot steps read int8 KV at ~3.2-3.5 TB/s; more warps or tensor-core dots were slower.
DEFAULT_CHUNK = 512
DEFAULT_WARPS = 1
DEFAULT_TILE = 32  # ring slots per loop step (at most the block size)
DEFAULT_STAGES = 2


def paged_write(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, offset: torch.Tensor, capacity: int) -> None:
    """Quantize one step's ``[B, H, 1, D]`` keys/values into ring slot ``offset % capacity`` (one kernel)."""
    batch, heads, _, dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    write_kernel[(batch, heads)](
        k,
        v,
        cache.keys,
        cache.values,
        cache.key_scales,
        cache.value_scales,
        cache.table,
        offset,
        cache.table.stride(0),
        capacity,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        H=heads,
        D=dim,
        BLOCK=cache.block_size,
        BITS=cache.bits,
        num_warps=1,
    )


def paged_decode(
    q: torch.Tensor,
    cache: PagedKVCache,
    offset: torch.Tensor,
    floor: torch.Tensor,
    span: int,
    capacity: int,
    context: int | None,
    *,
    chunk: int = DEFAULT_CHUNK,
    warps: int = DEFAULT_WARPS,
    tile: int = DEFAULT_TILE,
    stages: int = DEFAULT_STAGES,
    byte_permute: bool | None = None,
) -> torch.Tensor:
    """``q`` ``[B, H, 1, D]`` -> ``[B, H, 1, D]``; the entry at ``offset`` was written this step.
    ``byte_permute``: stored bytes to floats by inline PTX (default: on CUDA tensors; Triton's
    CPU interpreter runs no PTX)."""
    batch, heads, _, dim = q.shape
    chunk = max(chunk, cache.block_size)
    tile = min(tile, cache.block_size)
    splits = -(-min(span, capacity) // chunk)
    q = q.contiguous()
    out = torch.empty_like(q)
    m = torch.empty(batch, heads, splits, device=q.device, dtype=torch.float32)
    denom = torch.empty_like(m)
    acc = torch.empty(batch, heads, splits, dim, device=q.device, dtype=torch.float32)
    partial_kernel[(batch, heads, splits)](
        q,
        cache.keys,
        cache.values,
        cache.key_scales,
        cache.value_scales,
        cache.table,
        offset,
        floor,
        m,
        denom,
        acc,
        cache.table.stride(0),
        span,
        capacity,
        NO_WINDOW if context is None else context,
        dim**-0.5,
        splits,
        H=heads,
        D=dim,
        BLOCK=cache.block_size,
        CHUNK=chunk,
        TILE=tile,
        BITS=cache.bits,
        BYTE_PERMUTE=q.is_cuda if byte_permute is None else byte_permute,
        num_warps=warps,
        num_stages=stages,
    )
    merge_kernel[(batch, heads)](
        m, denom, acc, out, splits, H=heads, D=dim, SPLITS=triton.next_power_of_2(splits), num_warps=1
    )
    return out
