"""A turn's end on the Kyutai STT engine, with and without a flush (``SttStream.flush``; issue 34):
marker placed -> ``Marker`` back, wall time, for streams fed at real time.

N streams in one process on ``KyutaiSttEngine`` (``--shape``: the tests' tiny checkpoint on the
CPU, or random weights of ``stt-1b`` / ``stt-2.6b`` on a GPU, written once into ``--weights-dir``
by ``bench_kyutai_served.write_stt_weights``). Each stream sends 80 ms frames of quiet noise on an
absolute schedule, as a microphone does, and every ``--turn-s`` places a marker at the end of
what it sent, as a manual commit does (all streams' turns end within one period, or spread over
``--turn-s`` with ``--stagger``, as independent conversations' do); turns alternate between flushing (the model's delay
stepped at once on inserted silence, in drain steps) and waiting the delay out in real time.
Turns of the first ``--warmup`` seconds do not count (on a GPU, the first steps of each
attention span capture its CUDA graphs). Prints p50 / p95 per kind beside the model's delay, and
the drain steps a second (over the whole run), the rows each advanced and their mean cost; JSON to
``benchmarks/results/bench_stt_flush.json``. ``--flush-rows 0 16``: one engine after the other in
this process, drain steps in the whole batch (0) and in a flush batch of 16 rows
(``stt_engine.flush_rows``). ``--between-ticks on off``: a flush's drain steps when it comes
(``stt_engine.flush_between_ticks``) or after the next tick; every combination is run, in turn
for ``--rounds`` rounds (medians of the rounds' p50 and p95).

    .venv/bin/python benchmarks/bench_stt_flush.py --streams 4 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_kyutai_served import write_stt_weights
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine
from rtserve.engines.kyutai_stt.events import Marker
from rtserve.engines.kyutai_stt.stream import SttStream

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_stt_flush.json"
FRAME_S = 0.08
DRAIN_KEYS = ("drains_per_s", "drain_rows", "drain_ms", "burst_frames")


async def _client(stream: SttStream, index: int, args: argparse.Namespace, waits: dict[str, list[float]]) -> None:
    frame = round(FRAME_S * 24_000)
    rng = np.random.default_rng(index)
    placed: dict[int, tuple[str, float]] = {}

    async def read() -> None:
        async for event in stream.events():
            if isinstance(event, Marker) and event.id in placed:
                kind, at = placed.pop(event.id)
                waits[kind].append(time.monotonic() - at)

    reader = asyncio.create_task(read())
    start = time.monotonic() + index * FRAME_S / args.streams  # phases spread over the period
    frames = round(args.duration / FRAME_S)
    turn_frames = round(args.turn_s / FRAME_S)
    offset = index * turn_frames // args.streams if args.stagger else 0  # this stream's turns' phase
    for k in range(frames):
        await asyncio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
        stream.push_audio(rng.uniform(-0.05, 0.05, frame).astype(np.float32))
        if k > offset and (k - offset) % turn_frames == 0:
            turn = (k - offset) // turn_frames
            kind = "flush" if (turn + index) % 2 else "wait"
            if k * FRAME_S >= args.warmup:  # a warm-up's turns pay for CUDA graphs captured on first use
                placed[turn] = (kind, time.monotonic())
            stream.mark(turn)
            if kind == "flush":
                stream.flush()
    await asyncio.sleep(2.0)  # the last markers' delay
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def run(args: argparse.Namespace, flush_rows: int, between_ticks: bool) -> dict[str, Any]:
    folder = args.weights_dir / f"stt-{args.shape}"
    if not (folder / "config.json").exists():
        write_stt_weights(folder, args.shape)
    config = load_config(environ={})
    device = "cuda" if args.shape != "tiny" else "cpu"
    dtype = "bfloat16" if args.shape != "tiny" else "float32"
    config.stt_engine = config.stt_engine.model_copy(
        update={
            "weights": str(folder),
            "batch_size": args.streams,
            "device": device,
            "dtype": dtype,
            "flush_rows": flush_rows,
            "flush_between_ticks": between_ticks,
        }
    )
    registry = CollectorRegistry()
    engine = KyutaiSttEngine(config, registry=registry)
    await engine.start()
    try:
        streams = [await engine.open_stream(f"s{i}") for i in range(args.streams)]
        delay_s = streams[0].delay_frames * FRAME_S
        waits: dict[str, list[float]] = {"flush": [], "wait": []}
        await asyncio.gather(*(_client(stream, i, args, waits) for i, stream in enumerate(streams)))
        for stream in streams:
            await stream.close(5)
    finally:
        await engine.stop()
    result: dict[str, Any] = {
        "shape": args.shape,
        "streams": args.streams,
        "stagger": args.stagger,
        "flush_rows": flush_rows,
        "between_ticks": between_ticks,
        "model_delay_ms": 1000 * delay_s,
    }
    # The drain steps the turns' ends were paid in: a second, rows advanced each, mean cost, and
    # the frames a burst stepped (flush rows; NaN without).
    steps, frames, seconds, burst_frames, bursts = (
        registry.get_sample_value(f"rtserve_kyutai_stt_{name}") or 0.0
        for name in (
            "drain_steps_total",
            "drained_input_frames_total",
            "drain_step_seconds_sum",
            "drain_burst_frames_sum",
            "drain_burst_frames_count",
        )
    )
    result["drains_per_s"] = steps / args.duration
    result["drain_rows"] = frames / steps if steps else float("nan")
    result["drain_ms"] = 1e3 * seconds / steps if steps else float("nan")
    result["burst_frames"] = burst_frames / bursts if bursts else float("nan")
    for kind, values in waits.items():
        ms = sorted(1000 * v for v in values)
        p50 = statistics.median(ms) if ms else float("nan")
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))] if ms else float("nan")
        result[kind] = {"turns": len(ms), "p50_ms": p50, "p95_ms": p95}
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    """One line per combination and turn end: the medians over its rounds."""
    first = results[0]
    print(f"{first['shape']}, {first['streams']} streams; model delay {first['model_delay_ms']:.0f} ms")
    print(
        f"{'flush rows':>10} {'between ticks':>13} {'turn end':>8} {'turns':>6} {'p50 ms':>8} {'p95 ms':>8}"
        f" {'drains/s':>8} {'rows/drain':>10} {'drain ms':>8} {'frames/burst':>12}"
    )
    combos = dict.fromkeys((r["flush_rows"], r["between_ticks"]) for r in results)
    for rows, between in combos:
        runs = [r for r in results if (r["flush_rows"], r["between_ticks"]) == (rows, between)]
        drains, per_drain, drain_ms, per_burst = (statistics.median(r[key] for r in runs) for key in DRAIN_KEYS)
        for kind in ("flush", "wait"):
            turns = sum(r[kind]["turns"] for r in runs)
            p50, p95 = (statistics.median(r[kind][q] for r in runs) for q in ("p50_ms", "p95_ms"))
            on = "on" if between else "off"
            print(
                f"{rows:>10} {on:>13} {kind:>8} {turns:>6} {p50:>8.0f} {p95:>8.0f}"
                f" {drains:>8.1f} {per_drain:>10.1f} {drain_ms:>8.1f} {per_burst:>12.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("tiny", "stt-1b", "stt-2.6b"), default="tiny")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of audio per stream")
    parser.add_argument("--turn-s", type=float, default=1.6, help="a marker every this many seconds")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds whose turns do not count")
    parser.add_argument(
        "--stagger",
        action="store_true",
        help="the streams' turns end spread over --turn-s (independent conversations: a few flush at once) "
        "instead of within one period",
    )
    parser.add_argument("--weights-dir", type=Path, default=ROOT / "benchmarks" / "results" / "weights")
    parser.add_argument("--flush-rows", type=int, nargs="+", default=[0], help="stt_engine.flush_rows, one run each")
    parser.add_argument(
        "--between-ticks",
        choices=("on", "off"),
        nargs="+",
        default=["on"],
        help="stt_engine.flush_between_ticks, one run each",
    )
    parser.add_argument("--rounds", type=int, default=1, help="every combination this many times, in turn")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    combos = [(rows, between == "on") for rows in args.flush_rows for between in args.between_ticks]
    results = [asyncio.run(run(args, *combo)) for _ in range(args.rounds) for combo in combos]
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
