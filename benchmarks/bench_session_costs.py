"""Per-session host costs that grow with the number of sessions a server holds (issues 32-35),
each tree side by side in one run:

* ``slot-open``: what opening one slot costs the engine thread at batch B: resetting a row of
  Mimi's streaming state (encoder and decoder: convolutions and the two transformers' KV rings),
  as ``FrameStep.reset_rows`` does for every Moshi, STT and TTS session that opens. Mimi has the
  published shape (random weights); median of 40 openings; on ``--device cuda`` the time includes
  the sync the reset ends with.
* ``vad``: the cascade's shared Silero VAD (``VadEngine``, one lane) scoring N sessions that each
  push 40 ms of audio at once, 25 times: wall and CPU seconds per second of audio (above 1 wall
  second the VAD falls behind real time).

Each tree (a checkout, e.g. ``git worktree add /tmp/before HEAD~1``) runs in its own child process
with ``PYTHONPATH=TREE``, one torch thread.

    .venv/bin/python benchmarks/bench_session_costs.py --trees /tmp/before . --sessions 64 256

JSON to ``benchmarks/results/bench_session_costs.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bench_session_costs.json"
OPENS = 40
VAD_PUSHES = 25  # 40 ms each: one second of audio per session


def slot_open(batch: int, device: str) -> dict[str, float]:
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
    return {"open_ms": 1e3 * sorted(times)[len(times) // 2]}


async def vad(sessions: int) -> dict[str, float]:
    """Wall and CPU seconds the shared VAD takes for one second of ``sessions`` sessions' audio."""
    import numpy as np
    from prometheus_client import CollectorRegistry

    from rtserve.config import ModelPaths
    from rtserve.engines.cascade.metrics import CascadeMetrics
    from rtserve.engines.cascade.model_paths import resolve_vad
    from rtserve.engines.cascade.vad import VadEngine, VadStream

    metrics = CascadeMetrics(CollectorRegistry())
    engine = VadEngine(resolve_vad(ModelPaths()), max_queue=4 * sessions, metrics=metrics, lanes=1)
    await engine.start()
    streams = [VadStream() for _ in range(sessions)]
    chunk = (np.random.default_rng(0).standard_normal(640) * 0.05).astype(np.float32)
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        for _ in range(VAD_PUSHES):
            await asyncio.gather(*(engine.process(stream, chunk) for stream in streams))
    finally:
        engine.stop()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=Path, nargs="+", default=[HERE.parent])
    parser.add_argument("--measure", nargs="+", choices=["slot-open", "vad"], default=["slot-open", "vad"])
    parser.add_argument("--sessions", type=int, nargs="+", default=[64, 256], help="B (slot-open) or N (vad)")
    parser.add_argument("--device", default="cpu", help="slot-open: cpu or cuda")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=3, metavar=("MEASURE", "SESSIONS", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure, sessions, device = args.child[0], int(args.child[1]), args.child[2]
        print(json.dumps(slot_open(sessions, device) if measure == "slot-open" else asyncio.run(vad(sessions))))
        return
    rows: list[dict[str, Any]] = []
    for measure in args.measure:
        for sessions in args.sessions:
            for tree in args.trees:
                env = {**os.environ, "PYTHONPATH": f"{tree.resolve()}{os.pathsep}{HERE}"}
                child = [sys.executable, __file__, "--child", measure, str(sessions), args.device]
                out = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
                rows.append({"measure": measure, "tree": str(tree), "sessions": sessions, **json.loads(out)})
    print(f"{'measure':<10} {'tree':<32} {'B / N':>6}  result")
    for row in rows:
        if row["measure"] == "slot-open":
            reading = f"{row['open_ms']:.2f} ms per opening"
        else:
            reading = f"{row['wall_s']:.3f} s wall, {row['cpu_s']:.3f} s CPU per second of audio"
        print(f"{row['measure']:<10} {row['tree']:<32} {row['sessions']:>6}  {reading}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
