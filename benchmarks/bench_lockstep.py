"""Lockstep scheduler cost and tick jitter, with the loopback engine.

For each slot count, every slot holds a live session fed one 80 ms frame per frame
period from the event loop, with a reader draining its output. Measured per tick on the
engine thread:

* scheduler overhead = whole tick minus the model step (control ops, gather, scatter,
  hand-off to the loop, metrics);
* jitter = tick start minus its deadline (catch-up ticks after an overrun start late by
  design, so they count here);
* overruns (ticks longer than the period), catch-up ticks (run back to back to consume
  input queued during an overrun) and skipped deadlines (more than the input backlog cap
  behind).

Usage: .venv/bin/python benchmarks/bench_lockstep.py [--ticks 100] [--slots 1,16,64,256]
Writes benchmarks/results/bench_lockstep.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig, ServerConfig
from rtserve.engines.lockstep import LockstepSession, LockstepSessionEngine, TickReport
from rtserve.engines.protocols import FrameModel
from rtserve.engines.reference import FRAME_SIZE, SAMPLE_RATE, LoopbackModel
from rtserve.engines.values import SessionOptions

WARMUP_TICKS = 10
RESULTS = Path(__file__).parent / "results" / "bench_lockstep.json"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def drain(session: LockstepSession, counter: list[int]) -> None:
    async for _ in session.events():
        counter[0] += 1


async def run_config(slots: int, ticks: int, model: FrameModel | None = None) -> dict[str, float]:
    """Measure ``model`` (default: the loopback engine's) with ``slots`` live, fed sessions."""
    config = ServerConfig(lockstep=LockstepConfig(batch_size=slots))
    reports: list[TickReport] = []
    engine = LockstepSessionEngine(
        "bench",
        model or LoopbackModel(slots, 1),
        config,
        CollectorRegistry(),
        supports_text_output=False,
        on_tick=reports.append,
    )
    await engine.start()
    # Concurrently: each open waits for the tick that makes its slot live.
    sessions = await asyncio.gather(*(engine.open_session(f"s{i}", SessionOptions()) for i in range(slots)))
    received = [0]
    readers = [asyncio.create_task(drain(s, received)) for s in sessions]
    frame = np.random.default_rng(0).uniform(-0.5, 0.5, FRAME_SIZE).astype(np.float32)
    period = FRAME_SIZE / SAMPLE_RATE
    loop = asyncio.get_running_loop()
    first = len(reports) + WARMUP_TICKS  # measure only ticks with every slot live and fed
    underruns_before = sum(s.lease.underruns for s in sessions)
    start, sent = loop.time(), 0
    while len(reports) < first + ticks:  # the feeder keeps its own drift-free schedule
        for session in sessions:
            session.push_audio(frame)
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * period - loop.time()))
    measured = reports[first : first + ticks]
    underruns = sum(s.lease.underruns for s in sessions) - underruns_before  # includes the warm-up ticks
    await asyncio.gather(*(s.close() for s in sessions))  # one tick frees them all; one by one is a tick each
    await asyncio.gather(*readers)
    await engine.stop()

    overhead_ms = [(r.duration_s - r.step_s) * 1e3 for r in measured]
    jitter_ms = [r.lateness_s * 1e3 for r in measured]
    step_ms = [r.step_s * 1e3 for r in measured]
    return {
        "slots": slots,
        "ticks": len(measured),
        "overhead_p50_ms": statistics.median(overhead_ms),
        "overhead_p99_ms": percentile(overhead_ms, 99),
        "step_p50_ms": statistics.median(step_ms),
        "step_p99_ms": percentile(step_ms, 99),
        "tick_p50_ms": statistics.median(r.duration_s * 1e3 for r in measured),
        "jitter_p50_ms": statistics.median(jitter_ms),
        "jitter_p99_ms": percentile(jitter_ms, 99),
        "overruns": sum(1 for r in measured if r.overrun_s > 0),
        "catch_up_ticks": sum(1 for r in measured if r.catch_up),
        "skipped_deadlines": sum(r.skipped for r in measured),
        "underruns_per_slot": underruns / slots,
        "frames_out_per_slot": received[0] / slots,
    }


def print_table(rows: list[dict[str, float]]) -> None:
    header = (
        "slots",
        "ticks",
        "overhead p50 ms",
        "overhead p99 ms",
        "step p50 ms",
        "tick p50 ms",
        "jitter p50 ms",
        "jitter p99 ms",
        "overruns",
        "catch-up",
        "skipped",
        "underruns/slot",
    )
    keys = (
        "slots",
        "ticks",
        "overhead_p50_ms",
        "overhead_p99_ms",
        "step_p50_ms",
        "tick_p50_ms",
        "jitter_p50_ms",
        "jitter_p99_ms",
        "overruns",
        "catch_up_ticks",
        "skipped_deadlines",
        "underruns_per_slot",
    )
    print(" | ".join(header))
    print(" | ".join("-" * len(h) for h in header))
    for row in rows:
        print(" | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=100, help="measured ticks per configuration")
    parser.add_argument("--slots", default="1,16,64,256", help="comma-separated slot counts")
    args = parser.parse_args()
    rows = [await run_config(int(n), args.ticks) for n in args.slots.split(",")]
    print(f"loopback engine, 24 kHz, 80 ms frames; {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print_table(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"frame_ms": 80, "warmup_ticks": WARMUP_TICKS, "cpus": os.cpu_count(), "results": rows}, indent=2)
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())
