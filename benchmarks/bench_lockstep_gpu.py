"""Lockstep ticks with the ``tiny`` torch frame model on a torch device, devices side by side.

Same harness as bench_lockstep.py (every slot a live session fed one 80 ms frame per
frame period, a reader draining its output, the real LockstepScheduler), with the tiny
GRU model on each device given. Per tick, on the engine thread:

* model step = the scheduler's timing of ``model.step``; on CUDA it ends in the blocking
  device->host copy of the batch, so it includes all device work of the tick;
* scheduler overhead = whole tick minus the step; jitter = tick start minus its deadline;
* overruns (ticks longer than the 80 ms period), catch-up ticks, skipped deadlines.

Usage: .venv/bin/python benchmarks/bench_lockstep_gpu.py [--device cuda,cpu] [--ticks 100]
       [--slots 1,16,64,256,1024] [--out PATH]
Writes benchmarks/results/bench_lockstep_gpu.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_lockstep import WARMUP_TICKS, run_config

from rtserve.engines.tiny_torch import TinyRecurrentFrameModel
from rtserve.engines.torch_device import resolve_device

RESULTS = Path(__file__).parent / "results" / "bench_lockstep_gpu.json"
COLUMNS = (
    ("device", "device"),
    ("slots", "slots"),
    ("step p50 ms", "step_p50_ms"),
    ("step p99 ms", "step_p99_ms"),
    ("overhead p50 ms", "overhead_p50_ms"),
    ("overhead p99 ms", "overhead_p99_ms"),
    ("jitter p50 ms", "jitter_p50_ms"),
    ("jitter p99 ms", "jitter_p99_ms"),
    ("overruns", "overruns"),
    ("catch-up", "catch_up_ticks"),
    ("skipped", "skipped_deadlines"),
    ("underruns/slot", "underruns_per_slot"),
)


def environment(devices: list[torch.device]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
    }
    if any(d.type == "cuda" for d in devices):
        index = next(d.index for d in devices if d.type == "cuda")
        props = torch.cuda.get_device_properties(index)
        env.update(
            {
                "gpu": props.name,
                "gpu_multiprocessors": props.multi_processor_count,
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]  # unannotated in torch
                "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            }
        )
    return env


def print_table(rows: list[dict[str, Any]]) -> None:
    print(" | ".join(header for header, _ in COLUMNS))
    print(" | ".join("-" * len(header) for header, _ in COLUMNS))
    for row in rows:
        print(" | ".join(f"{row[key]:.3f}" if isinstance(row[key], float) else str(row[key]) for _, key in COLUMNS))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="comma-separated torch devices, e.g. cuda,cpu")
    parser.add_argument("--ticks", type=int, default=100, help="measured ticks per configuration")
    parser.add_argument("--slots", default="1,16,64,256", help="comma-separated slot counts")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args()
    devices = [resolve_device(name, "--device") for name in args.device.split(",")]
    env = environment(devices)
    rows: list[dict[str, Any]] = []
    for slots in (int(n) for n in args.slots.split(",")):
        for device in devices:
            model = TinyRecurrentFrameModel(slots, device=device)
            rows.append({"device": str(device), **await run_config(slots, args.ticks, model)})
    print("tiny GRU frame model, 24 kHz, 80 ms frames; " + ", ".join(f"{k} {v}" for k, v in env.items()))
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"frame_ms": 80, "warmup_ticks": WARMUP_TICKS, "environment": env, "results": rows}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
