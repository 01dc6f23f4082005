"""What opening one slot costs the engine thread at batch B (issues 32, 35): resetting a row of
Mimi's streaming state (encoder and decoder: convolutions and the two transformers' KV rings),
as ``FrameStep.reset_rows`` does for every Moshi, STT and TTS session that opens.

Mimi has the published shape (random weights). Each tree (a checkout, e.g. ``git worktree add
/tmp/before HEAD~1``) runs in its own child process with ``PYTHONPATH=TREE``, one torch thread;
the median of 40 opens is reported per tree and B. On a GPU (``--device cuda``) the time
includes the sync the reset ends with (it waits for its own kernels).

    .venv/bin/python benchmarks/bench_slot_open.py --trees /tmp/before . --batch 64 256

JSON to ``benchmarks/results/bench_slot_open.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bench_slot_open.json"
OPENS = 40


def measure(batch: int, device: str) -> float:
    """Median ms to reset one row of a ``batch``-row Mimi (this process's ``rtserve``)."""
    import torch
    from moshi_build import mimi_config

    from rtserve.engines.moshi.lm_config import MimiConfig
    from rtserve.engines.moshi.mimi import Mimi

    torch.set_num_threads(1)
    mimi = Mimi(MimiConfig.from_dict(mimi_config("full", 2048)), 8).to(device)
    mimi.start(batch)
    times = []
    for slot in range(OPENS):
        mask = torch.zeros(batch, dtype=torch.bool, device=device)
        mask[slot % batch] = True
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        mimi.reset_encoder_rows(mask)
        mimi.reset_decoder_rows(mask)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=Path, nargs="+", default=[HERE.parent])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("BATCH", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(int(args.child[0]), args.child[1])))
        return
    rows = []
    for batch in args.batch:
        for tree in args.trees:
            env = {**os.environ, "PYTHONPATH": f"{tree.resolve()}{os.pathsep}{HERE}"}
            child = [sys.executable, __file__, "--child", str(batch), args.device]
            out = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
            rows.append({"tree": str(tree), "batch": batch, "device": args.device, "open_ms": json.loads(out)})
    print(f"{'tree':<40} {'B':>5} {'one slot opening (ms)':>22}")
    for row in rows:
        print(f"{row['tree']:<40} {row['batch']:>5} {row['open_ms']:>22.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
