"""The Triton kernels behind ``rvq_search`` (CUDA): one residual-VQ codebook's nearest entries as
split partial minima, then the pick across splits and the residual update.

Kernel parameters stay unannotated: Triton reads a parameter's annotation as its kernel type
(see ``paged_kernels``); the typed entry point is ``rvq_search.nearest_codes``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def partial_nearest_kernel(
    x_ptr,
    book_ptr,
    norm_ptr,
    best_ptr,
    index_ptr,
    rows,
    bins,
    chunk,
    splits,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Rows ``BM`` x entries ``[split * chunk, + chunk)``: the smallest ``|c|^2 - 2 x.c`` and its
    entry (the first on a tie), the dot products in ``PRECISION`` (``tl.dot``'s names)."""
    row = tl.program_id(0) * BM + tl.arange(0, BM)
    split = tl.program_id(1)
    live = row < rows
    best = tl.full((BM,), float("inf"), tl.float32)
    index = tl.zeros((BM,), tl.int32)
    for start in range(split * chunk, split * chunk + chunk, BN):
        entry = start + tl.arange(0, BN)
        valid = entry < bins
        dots = tl.zeros((BM, BN), tl.float32)
        for k in range(0, D, BK):
            dims = k + tl.arange(0, BK)
            x = tl.load(x_ptr + row[:, None] * D + dims[None, :], mask=live[:, None], other=0.0)
            book = tl.load(book_ptr + entry[None, :] * D + dims[:, None], mask=valid[None, :], other=0.0)
            dots = tl.dot(x, book, dots, input_precision=PRECISION)
        norm = tl.load(norm_ptr + entry, mask=valid, other=0.0)
        distance = tl.where(valid[None, :], norm[None, :] - 2.0 * dots, float("inf"))
        value, nearest = tl.min(distance, 1, return_indices=True, return_indices_tie_break_left=True)
        better = value < best
        best = tl.where(better, value, best)
        index = tl.where(better, start + nearest, index)
    tl.store(best_ptr + row * splits + split, best, mask=live)
    tl.store(index_ptr + row * splits + split, index, mask=live)


@triton.jit
def take_nearest_kernel(
    x_ptr,
    book_ptr,
    best_ptr,
    index_ptr,
    codes_ptr,
    rows,
    layer,
    layers,
    splits,
    D: tl.constexpr,
    BM: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """Each row's nearest entry across the splits (the earliest split on a tie: the lowest entry),
    written to ``codes[row, layer]`` and subtracted from the row's residual in place."""
    row = tl.program_id(0) * BM + tl.arange(0, BM)
    live = row < rows
    split = tl.arange(0, SPLITS)
    seen = live[:, None] & (split < splits)[None, :]
    best = tl.load(best_ptr + row[:, None] * splits + split[None, :], mask=seen, other=float("inf"))
    index = tl.load(index_ptr + row[:, None] * splits + split[None, :], mask=seen, other=0)
    _, pick = tl.min(best, 1, return_indices=True, return_indices_tie_break_left=True)
    nearest = tl.sum(tl.where(split[None, :] == pick[:, None], index, 0), 1)
    dims = tl.arange(0, D)
    at = row[:, None] * D + dims[None, :]
    x = tl.load(x_ptr + at, mask=live[:, None], other=0.0)
    entry = tl.load(book_ptr + nearest[:, None] * D + dims[None, :], mask=live[:, None], other=0.0)
    tl.store(x_ptr + at, x - entry, mask=live[:, None])
    tl.store(codes_ptr + row * layers + layer, nearest, mask=live)
