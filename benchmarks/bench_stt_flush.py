"""A turn's end on the Kyutai STT engine, with and without a flush (``SttStream.flush``; issue 34):
marker placed -> ``Marker`` back, wall time, for streams fed at real time.

N streams in one process on ``KyutaiSttEngine`` (``--shape``: the tests' tiny checkpoint on the
CPU, or random weights of ``stt-1b`` / ``stt-2.6b`` on a GPU, written once into ``--weights-dir``
by ``bench_kyutai_served.write_stt_weights``). Each stream sends 80 ms frames of quiet noise on an
absolute schedule, as a microphone does, and every ``--turn-s`` places a marker at the end of
what it sent, as a manual commit does; turns alternate between flushing (the model's delay
stepped at once on inserted silence, in drain steps) and waiting the delay out in real time.
Prints p50 / p95 per kind beside the model's delay; JSON to
``benchmarks/results/bench_stt_flush.json``. ``--flush-rows 0 16``: one engine after the other in
this process, drain steps in the whole batch (0) and in a flush batch of 16 rows
(``stt_engine.flush_rows``).

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
    for k in range(frames):
        await asyncio.sleep(max(0.0, start + k * FRAME_S - time.monotonic()))
        stream.push_audio(rng.uniform(-0.05, 0.05, frame).astype(np.float32))
        if k and k % turn_frames == 0:
            turn = k // turn_frames
            kind = "flush" if (turn + index) % 2 else "wait"
            placed[turn] = (kind, time.monotonic())
            stream.mark(turn)
            if kind == "flush":
                stream.flush()
    await asyncio.sleep(2.0)  # the last markers' delay
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def run(args: argparse.Namespace, flush_rows: int) -> dict[str, Any]:
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
        }
    )
    engine = KyutaiSttEngine(config, registry=CollectorRegistry())
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
        "flush_rows": flush_rows,
        "model_delay_ms": 1000 * delay_s,
    }
    for kind, values in waits.items():
        ms = sorted(1000 * v for v in values)
        p50 = statistics.median(ms) if ms else float("nan")
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))] if ms else float("nan")
        result[kind] = {"turns": len(ms), "p50_ms": p50, "p95_ms": p95}
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    first = results[0]
    print(f"{first['shape']}, {first['streams']} streams; model delay {first['model_delay_ms']:.0f} ms")
    print(f"{'flush rows':>10} {'turn end':>10} {'turns':>6} {'p50 ms':>8} {'p95 ms':>8}")
    for result in results:
        for kind in ("flush", "wait"):
            row = result[kind]
            print(
                f"{result['flush_rows']:>10} {kind:>10} {row['turns']:>6} {row['p50_ms']:>8.0f} {row['p95_ms']:>8.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("tiny", "stt-1b", "stt-2.6b"), default="tiny")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of audio per stream")
    parser.add_argument("--turn-s", type=float, default=1.6, help="a marker every this many seconds")
    parser.add_argument("--weights-dir", type=Path, default=ROOT / "benchmarks" / "results" / "weights")
    parser.add_argument("--flush-rows", type=int, nargs="+", default=[0], help="stt_engine.flush_rows, one run each")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = [asyncio.run(run(args, rows)) for rows in args.flush_rows]
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
