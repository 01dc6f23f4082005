"""Moshi engine vs the reference ``moshi`` package: per-frame step time at batch B, side by side,
plus a greedy token-agreement check over 100 frames (docs/design.md#gpu-engines).

Both sides get the same random weights (no download): the reference modules are built
with random init, and ours load their state dicts through the same Kyutai-name mapping
the folder loader uses. One frame = Mimi encode of the user frame + one temporal step +
``dep_q`` depformer steps + Mimi decode of the agent frame.

Run on a CUDA machine for the published shape (7B LM in bf16, full Mimi):
``python benchmarks/bench_moshi_engine.py``; on CPU it runs a small shape
(``--shape tiny``) so the script itself stays testable. Needs ``moshi==0.2.13`` (installed
``--no-deps``) and ``einops``. Prints a table; JSON goes to
``benchmarks/results/bench_moshi_engine.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # the reference would otherwise compile small kernels

import torch
from moshi_build import build, sync

from rtserve.engines.moshi.generator import TokenStream
from rtserve.engines.moshi.lm import MoshiLM
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler

RESULTS = Path(__file__).parent / "results" / "bench_moshi_engine.json"


@torch.no_grad()
def time_ours(lm: MoshiLM, mimi: Mimi, batch: int, frames: int, device: torch.device) -> list[float]:
    mimi.start(batch)
    stream = TokenStream(lm, batch, SlotSampler(batch, device, MoshiSampling()))
    pcm = torch.randn(batch, mimi.frame_size, device=device) * 0.1
    times = []
    for _ in range(frames):
        sync(device)
        start = time.perf_counter()
        codes = mimi.encode(pcm)
        out = stream.step(codes)
        mimi.decode(out.tokens[:, 1:9].clamp(min=0))
        sync(device)
        times.append(time.perf_counter() - start)
    return times


@torch.no_grad()
def time_reference(ref_lm: Any, ref_mimi: Any, batch: int, frames: int, device: torch.device) -> list[float]:
    from moshi.models.lm import LMGen

    gen = LMGen(ref_lm, use_sampling=False)
    pcm = torch.randn(batch, 1, ref_mimi.frame_size, device=device) * 0.1
    times = []
    with gen.streaming(batch), ref_mimi.streaming(batch):
        for _ in range(frames):
            sync(device)
            start = time.perf_counter()
            codes = ref_mimi.encode(pcm)
            out = gen.step(codes[:, :8])
            if out is not None:
                ref_mimi.decode(out[:, 1:9])
            sync(device)
            times.append(time.perf_counter() - start)
    return times


@torch.no_grad()
def agreement(ref_lm: Any, lm: MoshiLM, frames: int, device: torch.device, card: int) -> dict[str, Any]:
    """Greedy tokens from both LMs fed the same user codes (Mimi excluded: it is fp32 on both sides)."""
    from moshi.models.lm import LMGen

    gen = LMGen(ref_lm, use_sampling=False)
    stream = TokenStream(lm, 1, SlotSampler(1, device, MoshiSampling()))
    generator = torch.Generator(device="cpu").manual_seed(1)
    same_frames, same_tokens, total_tokens, first_diff = 0, 0, 0, None
    compared = 0
    with gen.streaming(1):
        for t in range(frames):
            user = torch.randint(0, card, (1, 8), generator=generator).to(device)
            expected = gen.step(user[:, :, None])
            ours = stream.step(user)
            if expected is None:
                continue
            compared += 1
            a, b = expected[:, :, 0], ours.tokens
            same_tokens += int((a == b).sum())
            total_tokens += a.numel()
            if torch.equal(a, b):
                same_frames += 1
            elif first_diff is None:
                first_diff = t
    return {
        "frames_compared": compared,
        "frames_identical": same_frames,
        "token_agreement": same_tokens / total_tokens,
        "first_divergent_frame": first_diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("7b", "tiny"), default=None)
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--agreement-frames", type=int, default=100)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shape = args.shape or ("7b" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    ref_lm, ref_mimi, lm, mimi, config = build(shape, device, dtype)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        row: dict[str, Any] = {"batch": batch}
        for name, fn in (
            ("ours", functools.partial(time_ours, lm, mimi, batch, args.frames, device)),
            ("reference", functools.partial(time_reference, ref_lm, ref_mimi, batch, args.frames, device)),
        ):
            try:
                times = fn()[3:]  # warm-up frames (kernel loads, CUDA-graph capture) excluded
                row[f"{name}_ms"] = 1000 * statistics.median(times)
                row[f"{name}_p95_ms"] = 1000 * sorted(times)[int(0.95 * (len(times) - 1))]
            except Exception as exc:  # noqa: BLE001 - a benchmark reports a side that cannot run
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        if cuda:
            torch.cuda.empty_cache()
    agree = agreement(ref_lm, lm, args.agreement_frames, device, config.card)
    device_name = torch.cuda.get_device_name() if cuda else platform.processor()
    print(f"moshi engine, shape={shape}, dtype={dtype}, device={device_name}")
    print(f"{'B':>4} {'ours ms/frame':>14} {'ref ms/frame':>14} {'ours p95':>10} {'ref p95':>10}")
    for r in rows:
        print(
            f"{r['batch']:>4} {r.get('ours_ms', float('nan')):>14.2f} {r.get('reference_ms', float('nan')):>14.2f} "
            f"{r.get('ours_p95_ms', float('nan')):>10.2f} {r.get('reference_p95_ms', float('nan')):>10.2f}"
            + "".join(f"  {k}={v}" for k, v in r.items() if k.endswith("error"))
        )
    print(
        f"greedy agreement over {agree['frames_compared']} frames: {agree['frames_identical']} identical frames, "
        f"token agreement {agree['token_agreement']:.4f}, first divergent frame {agree['first_divergent_frame']}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "shape": shape,
        "dtype": str(dtype),
        "device": str(device),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "frames": args.frames,
        "rows": rows,
        "agreement": agree,
    }
    out = Path(os.environ.get("BENCH_OUT", RESULTS))
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
