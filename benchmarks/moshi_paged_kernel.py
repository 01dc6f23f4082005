"""One temporal attention layer at the 7B shape (32 heads x 128): bf16 SDPA over a ring span
(what the bf16 engine runs) against the paged Triton kernel in 8 and 4 bits (``--bits``), per
variant (ring slots per program, warps, slots per loop step, pipeline stages), at B rows of
``fill`` frames. Prints ms and the achieved rate over the bytes each must read (bf16: 2 B per
K/V element; paged: 1 or 1/2 B plus a 4 B scale per frame and head); JSON to
``benchmarks/results/moshi_paged_kernel.json``. CUDA only.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any, TypedDict

import torch
import triton.testing
from torch.nn import functional as F

from rtserve.engines.moshi.layers import StepPlan
from rtserve.engines.moshi.paged_attention import paged_decode
from rtserve.engines.moshi.paged_kv import PagedKVCache, PagedKVSpec

RESULTS = Path(__file__).parent / "results" / "moshi_paged_kernel.json"
HEADS, DIM, BLOCK, CONTEXT = 32, 128, 64, 3000


class KernelOptions(TypedDict, total=False):
    """``paged_decode``'s tuning keywords, as one variant sets them."""

    chunk: int
    warps: int
    tile: int
    stages: int
    byte_permute: bool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--fill", type=int, default=1500)
    parser.add_argument(
        "--variants",
        default="512x1x32x2,256x1x32x2,3008x1x32x2,512x2x64x2,512x4x64x2,512x1x16x2",
        help="ring slots per program x warps x slots per loop step x stages, comma list; a trailing c: "
        "bytes to floats by the conversion instruction, not the byte permute",
    )
    parser.add_argument("--bits", type=int, nargs="+", choices=[8, 4], default=[8, 4])
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = torch.device("cuda")
    width = PagedKVSpec(num_blocks=1, block_size=BLOCK).width(CONTEXT)
    capacity = width * BLOCK
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        used = args.fill // BLOCK + 1
        table = torch.zeros(batch, width, dtype=torch.int32, device=device)
        table[:, :used] = torch.randperm(batch * used, device=device).view(batch, used).int() + 1
        offset = torch.full((batch,), args.fill, device=device)
        floor = torch.zeros(batch, dtype=torch.long, device=device)
        span = -(-(args.fill + 1) // 256) * 256
        q = torch.randn(batch, HEADS, 1, DIM, device=device, dtype=torch.bfloat16)
        plan = StepPlan.build(offset, 1, HEADS, DIM, capacity, CONTEXT, span, None, floor, dtype=q.dtype)
        row: dict[str, Any] = {"batch": batch, "fill": args.fill}
        for bits in args.bits:
            cache = PagedKVCache.empty(PagedKVSpec(batch * used, BLOCK, bits), HEADS, DIM, table)
            for pool in (cache.keys, cache.values):
                pool.random_(-128, 128)  # any byte: a value, or two nibbles
            for scales in (cache.key_scales, cache.value_scales):
                scales.uniform_(0.01, 0.03)
            keys, values = cache.gather(span, torch.bfloat16)
            want = F.scaled_dot_product_attention(q, keys, values, plan.mask)
            if "bf16_sdpa" not in row:
                sdpa = functools.partial(F.scaled_dot_product_attention, q, keys, values, plan.mask)
                ms = triton.testing.do_bench(sdpa, return_mode="median")
                row["bf16_sdpa"] = {"ms": ms, "tb_s": batch * HEADS * span * 2 * DIM * 2 / ms / 1e9}
            del keys, values
            paged_bytes = batch * HEADS * (args.fill + 1) * 2 * (DIM * bits // 8 + 4)
            for variant in args.variants.split(","):
                chunk, warps, tile, stages = (int(x) for x in variant.rstrip("c").split("x"))
                options: KernelOptions = {"chunk": chunk, "warps": warps, "tile": tile, "stages": stages}
                if variant.endswith("c"):
                    options["byte_permute"] = False
                got = paged_decode(q, cache, offset, floor, span, capacity, CONTEXT, **options)
                err = float((got.float() - want.float()).norm() / want.float().norm())
                decode = functools.partial(paged_decode, q, cache, offset, floor, span, capacity, CONTEXT, **options)
                ms = triton.testing.do_bench(decode, return_mode="median")
                row[f"int{bits} {variant}"] = {"ms": ms, "tb_s": paged_bytes / ms / 1e9, "rel_err_vs_sdpa": err}
            del cache
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{'B':>4} {'variant':>16} {'ms':>8} {'TB/s':>6}")
    for row in rows:
        for name, r in row.items():
            if isinstance(r, dict):
                print(f"{row['batch']:>4} {name:>16} {r['ms']:>8.3f} {r['tb_s']:>6.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
