"""The Triton kernels behind ``paged_attention`` (CUDA): the split-K partial softmax over paged
8-bit or 4-bit KV, the merge of the splits, and the quantize-and-store of one step's keys and
values. ``BITS`` 4 packs element ``d`` and ``d + D / 2`` into one byte (``paged_kv.pack_nibbles``);
the attention loop reads both widths as whole vectors, 4-bit ones with their lanes in byte
order (the 8-bit loop as two half-vector loads measured ~15% slower on an H200).

Kernel parameters stay unannotated: Triton reads a parameter's annotation as its kernel type
(``tl.constexpr``, or a scalar type it specializes on), so Python types there would change the
compiled kernels. The module is type-checked with untyped definitions allowed for that reason
(pyproject.toml); the typed entry points are ``paged_attention.paged_write`` and ``paged_decode``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _element_order(D: tl.constexpr, BITS: tl.constexpr):
    """Which element of a vector each lane holds, as ``_load_vectors`` returns them: in order for
    8 bits; for 4 bits each byte's two nibbles side by side (elements ``d`` and ``d + D / 2``)."""
    lanes = tl.arange(0, D)
    if BITS == 4:
        lanes = lanes // 2 + (lanes % 2) * (D // 2)
    return lanes


# A float32 whose bits are 0x4B0000uu is 2**23 + uu: an unsigned byte becomes a float with one
# byte permute (PTX ``prmt``) and one subtraction. The integer-to-float conversion the plain
# path uses runs on a unit with 1/8 of the FP32 lanes, and at one conversion per stored
# element it, not the memory, bounded the kernel (8-bit and 4-bit KV took the same time).
_MAGIC_FLOAT_BITS = "0x4B000000"
_MAGIC = tl.constexpr(8388608.0)  # 2**23

# Four signed bytes (one register) -> four floats' bits 2**23 + byte + 128.
_BYTES_TO_FLOAT_BITS = tl.constexpr(f"""{{
.reg .b32 u, m;
xor.b32 u, $4, 0x80808080;
mov.b32 m, {_MAGIC_FLOAT_BITS};
prmt.b32 $0, u, m, 0x7540;
prmt.b32 $1, u, m, 0x7541;
prmt.b32 $2, u, m, 0x7542;
prmt.b32 $3, u, m, 0x7543;
}}""")

# Four bytes of two signed nibbles each -> the low nibbles' and the high nibbles' float bits,
# 2**23 + nibble + 8.
_NIBBLES_TO_FLOAT_BITS = tl.constexpr(f"""{{
.reg .b32 u, lo, hi, m;
xor.b32 u, $8, 0x88888888;
and.b32 lo, u, 0x0F0F0F0F;
shr.u32 hi, u, 4;
and.b32 hi, hi, 0x0F0F0F0F;
mov.b32 m, {_MAGIC_FLOAT_BITS};
prmt.b32 $0, lo, m, 0x7540;
prmt.b32 $1, lo, m, 0x7541;
prmt.b32 $2, lo, m, 0x7542;
prmt.b32 $3, lo, m, 0x7543;
prmt.b32 $4, hi, m, 0x7540;
prmt.b32 $5, hi, m, 0x7541;
prmt.b32 $6, hi, m, 0x7542;
prmt.b32 $7, hi, m, 0x7543;
}}""")


@triton.jit
def _load_vectors(ptr, rows, order, D: tl.constexpr, BITS: tl.constexpr, BYTE_PERMUTE: tl.constexpr):
    """The stored vectors ``rows`` as float32 ``[rows, D]``, lanes in ``_element_order``.
    ``BYTE_PERMUTE`` (CUDA only: inline PTX) converts by the float-bits trick above."""
    if BITS == 8:
        stored = tl.load(ptr + rows[:, None] * D + order[None, :])
        if BYTE_PERMUTE:
            bits = tl.inline_asm_elementwise(
                _BYTES_TO_FLOAT_BITS, "=r,=r,=r,=r,r", [stored], dtype=tl.int32, is_pure=True, pack=4
            )
            vectors = bits.to(tl.float32, bitcast=True) - (_MAGIC + 128.0)
        else:
            vectors = stored.to(tl.float32)
    else:
        half = tl.arange(0, D // 2)
        stored = tl.load(ptr + rows[:, None] * (D // 2) + half[None, :])
        if BYTE_PERMUTE:
            low_bits, high_bits = tl.inline_asm_elementwise(
                _NIBBLES_TO_FLOAT_BITS,
                "=r,=r,=r,=r,=r,=r,=r,=r,r",
                [stored],
                dtype=(tl.int32, tl.int32),
                is_pure=True,
                pack=4,
            )
            low = low_bits.to(tl.float32, bitcast=True) - (_MAGIC + 8.0)
            high = high_bits.to(tl.float32, bitcast=True) - (_MAGIC + 8.0)
        else:
            byte = stored.to(tl.int32)
            low = (((byte & 15) ^ 8) - 8).to(tl.float32)
            high = (byte >> 4).to(tl.float32)  # arithmetic shift: the sign comes with the high nibble
        vectors = tl.interleave(low, high)
    return vectors


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
    BITS: tl.constexpr,
    BYTE_PERMUTE: tl.constexpr,
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
    order = _element_order(D, BITS)
    q = tl.load(q_ptr + (row * H + head) * D + order).to(tl.float32) * sm_scale
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
        k = _load_vectors(k_ptr, base + within, order, D, BITS, BYTE_PERMUTE)
        v = _load_vectors(v_ptr, base + within, order, D, BITS, BYTE_PERMUTE)
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
    tl.store(acc_ptr + part * D + order, acc)


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
def _round(x, inverse, qmax):
    q = x * inverse
    q = tl.where(q == q, q, 0.0)
    return tl.minimum(tl.maximum(tl.floor(q + 0.5), -qmax), qmax)


@triton.jit
def _quantize_store(x_ptr, q_ptr, s_ptr, slot_base, half, D: tl.constexpr, BITS: tl.constexpr):
    low = tl.load(x_ptr + half).to(tl.float32)
    high = tl.load(x_ptr + (D // 2) + half).to(tl.float32)
    qmax = 127.0 if BITS == 8 else 7.0
    scale = tl.maximum(tl.max(tl.abs(low), 0), tl.max(tl.abs(high), 0)) / qmax
    scale = tl.where((scale == scale) & (scale < float("inf")), scale, 0.0)  # never NaN or inf
    inverse = tl.where(scale > 0, 1.0 / tl.maximum(scale, 1e-38), 0.0)
    q_low = _round(low, inverse, qmax)
    q_high = _round(high, inverse, qmax)
    if BITS == 8:
        tl.store(q_ptr + slot_base * D + half, q_low.to(tl.int8))
        tl.store(q_ptr + slot_base * D + (D // 2) + half, q_high.to(tl.int8))
    else:
        byte = (q_low.to(tl.int32) & 15) | ((q_high.to(tl.int32) & 15) << 4)
        byte = tl.where(byte > 127, byte - 256, byte)
        tl.store(q_ptr + slot_base * (D // 2) + half, byte.to(tl.int8))
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
    BITS: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(offset_ptr + row) % capacity
    block = tl.load(table_ptr + row * table_stride + slot // BLOCK).to(tl.int64)
    slot_base = (block * H + head) * BLOCK + slot % BLOCK
    half = tl.arange(0, D // 2)
    _quantize_store(k_ptr + row * k_stride_b + head * k_stride_h, kq_ptr, ks_ptr, slot_base, half, D, BITS)
    _quantize_store(v_ptr + row * v_stride_b + head * v_stride_h, vq_ptr, vs_ptr, slot_base, half, D, BITS)
