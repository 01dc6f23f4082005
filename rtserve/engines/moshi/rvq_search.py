"""Residual-VQ encoding on CUDA: each codebook's nearest entries in two Triton kernels
(``rvq_kernels``) instead of a matmul, an argmin, a lookup and a subtraction.

At B=256 the four took ~70 us per codebook on an H200, 32 codebooks in series (Kyutai STT's
codec): ~2 ms of a 12 ms frame, with the GEMM at 64 CTAs for 132 SMs and the argmin alone 27 us.
Here programs take a block of rows x a chunk of the entries, keep a running minimum, and a second
kernel picks across chunks and updates the residual (benchmarks/notes/kyutai_speed.md). The dot
products are 3xTF32 (three TF32 products per term, close to fp32's precision), so an entry can
differ from the matmul path's only on a near tie; none did on the published codec's shape.
"""

from __future__ import annotations

import torch
import triton

from rtserve.engines.moshi.rvq_kernels import partial_nearest_kernel, take_nearest_kernel

# 64 rows x 64 entries a program: 4 x 32 programs at B=256 for 2048 entries. Measured in one call
# (Mimi encode at B=256, H200): 16 x 256 6.32 ms, 32 x 128 6.17, 64 x 64 6.05, 64 x 32 6.06; 8
# warps slower; the matmul path 6.88.
ROWS_PER_PROGRAM = 64
ENTRIES_PER_STEP = 64
DIMS_PER_STEP = 32
CHUNK = 64  # entries per program
PRECISION = "tf32x3"  # IEEE fp32 dots (FMA) took 4x as long in Triton
WARPS = 4


def nearest_codes(residual: torch.Tensor, codebooks: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """``residual`` ``[N, D]`` fp32 (contiguous; consumed: left as the last residual),
    ``codebooks`` ``[L, bins, D]``, ``norms`` ``[L, bins]`` (``|c|^2``) -> ``[N, L]`` codes."""
    rows, dim = residual.shape
    layers, bins, _ = codebooks.shape
    assert residual.is_contiguous() and codebooks.is_contiguous()
    assert dim >= 16 and dim & (dim - 1) == 0, "a power of two, at least a dot's 16 (mimi.kernel_tiles)"
    splits = triton.cdiv(bins, CHUNK)
    best = torch.empty(rows, splits, device=residual.device, dtype=torch.float32)
    index = torch.empty(rows, splits, device=residual.device, dtype=torch.int32)
    codes = torch.empty(rows, layers, device=residual.device, dtype=torch.int32)
    blocks = triton.cdiv(rows, ROWS_PER_PROGRAM)
    for layer in range(layers):
        partial_nearest_kernel[(blocks, splits)](
            residual,
            codebooks[layer],
            norms[layer],
            best,
            index,
            rows,
            bins,
            CHUNK,
            splits,
            D=dim,
            BM=ROWS_PER_PROGRAM,
            BN=ENTRIES_PER_STEP,
            BK=min(DIMS_PER_STEP, dim),
            PRECISION=PRECISION,
            num_warps=WARPS,
        )
        take_nearest_kernel[(blocks,)](
            residual,
            codebooks[layer],
            best,
            index,
            codes,
            rows,
            layer,
            layers,
            splits,
            D=dim,
            BM=ROWS_PER_PROGRAM,
            SPLITS=triton.next_power_of_2(splits),
            num_warps=4,
        )
    return codes.long()
