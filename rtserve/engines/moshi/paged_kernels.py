"""The Triton kernels behind ``paged_attention`` (CUDA): the split-K partial softmax over paged
int8 KV, the merge of the splits, and the quantize-and-store of one step's keys and values.

Kernel parameters stay unannotated: Triton reads a parameter's annotation as its kernel type
(``tl.constexpr``, or a scalar type it specializes on), so Python types there would change the
compiled kernels. The module is type-checked with untyped definitions allowed for that reason
(pyproject.toml); the typed entry points are ``paged_attention.paged_write`` and ``paged_decode``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def partial_kernel(
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
def merge_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, splits, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
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
def write_kernel(
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
