"""Where a Moshi frame's time goes: each part of our per-frame step captured as its own CUDA
graph and timed alone (Mimi encode, temporal transformer, the whole LM step incl. depformer
and sampling, Mimi decode), at batch B and context fill F, with the bytes the temporal step
must read (weights + KV) and the rate that implies.

CUDA only: ``python benchmarks/moshi_breakdown.py [--batches 1,64,160] [--ring 1500]``;
JSON to ``benchmarks/results/moshi_breakdown.json``. Same random 7B weights as
``moshi_tick.py`` (``moshi_build``); the reference is built too but not timed here.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")

import torch
from moshi_build import build, module_bytes, prefill_ours, set_ours_ring, share_weights

from rtserve.engines.moshi.frame_step import FrameStep
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler

RESULTS = Path(__file__).parent / "results" / "moshi_breakdown.json"


def graph_ms(fn: Callable[[], Any], replays: int = 20) -> float:
    """Median ms of one replay of ``fn`` captured as a CUDA graph (device events)."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream.__new__ unannotated
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times: list[float] = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64,160")
    parser.add_argument("--ring", type=int, default=1500)
    parser.add_argument("--fills", default="0,1500")
    args = parser.parse_args()
    device = torch.device("cuda")
    ref_lm, _, lm, mimi, config = build("7b", device, torch.bfloat16)
    share_weights(lm, ref_lm)
    set_ours_ring(lm, args.ring)
    temporal_weights = module_bytes(lm.transformer) + module_bytes(lm.text_linear)  # embeddings: B rows only
    kv_frame = config.num_layers * 2 * config.dim * 2
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        frame = FrameStep(lm, mimi, SlotSampler(batch, device, MoshiSampling()), batch)
        pcm = torch.randn(batch, mimi.frame_size, device=device) * 0.1
        frame.pcm.copy_(pcm)
        codes = mimi.encode(frame.pcm)
        x = torch.randn(batch, 1, config.dim, device=device, dtype=torch.bfloat16)
        for fill in [int(f) for f in args.fills.split(",")]:
            prefill_ours(lm, fill)
            span = next((s for s in frame.spans if s > fill), frame.spans[-1])
            lm.transformer.span = span
            row: dict[str, Any] = {"batch": batch, "fill": fill, "span": span}
            row["mimi_encode_ms"] = graph_ms(functools.partial(mimi.encode, frame.pcm))
            row["temporal_ms"] = graph_ms(functools.partial(lm.temporal, x))
            user_codes = codes[:, : config.user_codebooks]
            row["lm_step_ms"] = graph_ms(functools.partial(frame.stream.step, user_codes, frame.overrides))
            row["mimi_decode_ms"] = graph_ms(functools.partial(mimi.decode, codes))
            lm.transformer.span = None
            row["depformer_and_sampling_ms"] = row["lm_step_ms"] - row["temporal_ms"]
            moved = temporal_weights + batch * span * kv_frame
            row["temporal_bytes_gb"] = moved / 1e9
            row["temporal_tb_per_s"] = moved / 1e12 / (row["temporal_ms"] / 1000)
            rows.append(row)
            print(json.dumps(row), flush=True)
        lm.start(0)  # free this batch's KV rings before the next batch allocates its own
        mimi.start(0)
        torch.cuda.empty_cache()
    print(
        f"{'B':>4} {'fill':>5} {'encode':>7} {'temporal':>9} {'depf+samp':>10} {'decode':>7} {'temporal GB':>12} "
        f"{'TB/s':>6}"
    )
    for r in rows:
        print(
            f"{r['batch']:>4} {r['fill']:>5} {r['mimi_encode_ms']:>7.2f} {r['temporal_ms']:>9.2f} "
            f"{r['depformer_and_sampling_ms']:>10.2f} {r['mimi_decode_ms']:>7.2f} {r['temporal_bytes_gb']:>12.1f} "
            f"{r['temporal_tb_per_s']:>6.2f}"
        )
    out = Path(os.environ.get("BENCH_OUT", RESULTS))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"ring": args.ring, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
