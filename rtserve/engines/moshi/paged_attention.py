"""Single-query attention over paged int8 KV (``PagedKVCache``) and the quantize-and-store of
each step's keys and values, as Triton kernels (CUDA).

Programs per (row, head, chunk of ring slots) walk only the blocks the row has reached (at
most ``span`` ring slots), dequantize keys and values in registers and keep an online softmax
that a second kernel merges across chunks: the KV
bytes read are 1 per element plus one scale per (frame, head), instead of 2 for bf16, and
nothing is materialised. The visibility rule is ``StepPlan``'s (ring slot -> absolute
position from the row's offset, window ``context``) plus the row's ``floor``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

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


@triton.jit
def _partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    offset_ptr,
    floor_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    table_stride,
    span,
    capacity,
    context,
    sm_scale,
    splits,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    last = tl.load(offset_ptr + row)  # position of the entry written this step
    floor = tl.load(floor_ptr + row)
    n = tl.minimum(tl.minimum(last + 1, capacity), span)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, n)
    last_slot = last % capacity
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + (row * H + head) * D + dims).to(tl.float32) * sm_scale
    m = tl.full((), -1e30, tl.float32)
    denom = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    within = tl.arange(0, TILE)
    for start in range(lo, hi, TILE):
        block = tl.load(table_ptr + row * table_stride + start // BLOCK).to(tl.int64)
        base = (block * H + head) * BLOCK + start % BLOCK
        slots = start + within
        delta = slots - last_slot
        pos = tl.where(delta <= 0, last + delta, last + delta - capacity)
        valid = (slots < n) & (pos >= floor) & (pos >= 0) & (last - pos < context)
        k = tl.load(k_ptr + (base + within)[:, None] * D + dims[None, :]).to(tl.float32)
        v = tl.load(v_ptr + (base + within)[:, None] * D + dims[None, :]).to(tl.float32)
        ks = tl.load(ks_ptr + base + within)
        vs = tl.load(vs_ptr + base + within)
        scores = tl.sum(k * q[None, :], 1) * ks
        scores = tl.where(valid, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new)
        acc = acc * alpha + tl.sum((p * vs)[:, None] * v, 0)
        denom = denom * alpha + tl.sum(p, 0)
        m = m_new
    part = (row * H + head) * splits + split
    tl.store(m_ptr + part, m)
    tl.store(l_ptr + part, denom)
    tl.store(acc_ptr + part * D + dims, acc)


@triton.jit
def _merge_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, splits, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    first = (row * H + head) * splits
    idx = tl.arange(0, SPLITS)
    used = idx < splits
    m = tl.load(m_ptr + first + idx, mask=used, other=-1e30)
    weight = tl.exp(m - tl.max(m, 0))
    denom = tl.sum(weight * tl.load(l_ptr + first + idx, mask=used, other=0.0), 0)
    dims = tl.arange(0, D)
    acc = tl.load(acc_ptr + (first + idx)[:, None] * D + dims[None, :], mask=used[:, None], other=0.0)
    out = tl.sum(weight[:, None] * acc, 0) / denom
    tl.store(out_ptr + (row * H + head) * D + dims, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _quantize_store(x_ptr, q_ptr, s_ptr, slot_base, dims, D: tl.constexpr):
    x = tl.load(x_ptr + dims).to(tl.float32)
    scale = tl.max(tl.abs(x), 0) / 127.0
    scale = tl.where((scale == scale) & (scale < float("inf")), scale, 0.0)  # never NaN or inf
    q = x * tl.where(scale > 0, 1.0 / tl.maximum(scale, 1e-38), 0.0)
    q = tl.where(q == q, q, 0.0)
    q = tl.minimum(tl.maximum(tl.floor(q + 0.5), -127.0), 127.0)
    tl.store(q_ptr + slot_base * D + dims, q.to(tl.int8))
    tl.store(s_ptr + slot_base, scale)


@triton.jit
def _write_kernel(
    k_ptr,
    v_ptr,
    kq_ptr,
    vq_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    offset_ptr,
    table_stride,
    capacity,
    k_stride_b,
    k_stride_h,
    v_stride_b,
    v_stride_h,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(offset_ptr + row) % capacity
    block = tl.load(table_ptr + row * table_stride + slot // BLOCK).to(tl.int64)
    slot_base = (block * H + head) * BLOCK + slot % BLOCK
    dims = tl.arange(0, D)
    _quantize_store(k_ptr + row * k_stride_b + head * k_stride_h, kq_ptr, ks_ptr, slot_base, dims, D)
    _quantize_store(v_ptr + row * v_stride_b + head * v_stride_h, vq_ptr, vs_ptr, slot_base, dims, D)


def paged_write(k: torch.Tensor, v: torch.Tensor, cache: PagedKVCache, offset: torch.Tensor, capacity: int) -> None:
    """Quantize one step's ``[B, H, 1, D]`` keys/values into ring slot ``offset % capacity`` (one kernel)."""
    batch, heads, _, dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    _write_kernel[(batch, heads)](
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
) -> torch.Tensor:
    """``q`` ``[B, H, 1, D]`` -> ``[B, H, 1, D]``; the entry at ``offset`` was written this step."""
    batch, heads, _, dim = q.shape
    chunk = max(chunk, cache.block_size)
    tile = min(tile, cache.block_size)
    splits = -(-min(span, capacity) // chunk)
    q = q.contiguous()
    out = torch.empty_like(q)
    m = torch.empty(batch, heads, splits, device=q.device, dtype=torch.float32)
    denom = torch.empty_like(m)
    acc = torch.empty(batch, heads, splits, dim, device=q.device, dtype=torch.float32)
    _partial_kernel[(batch, heads, splits)](
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
        num_warps=warps,
        num_stages=stages,
    )
    _merge_kernel[(batch, heads)](
        m, denom, acc, out, splits, H=heads, D=dim, SPLITS=triton.next_power_of_2(splits), num_warps=1
    )
    return out
