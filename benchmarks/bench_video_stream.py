"""Streaming video output: how soon ``WS /v1/realtime/video`` sends the first fMP4 chunk after
the first segment is decoded, and whether chunks arrive at least as fast as playback (issue 36).

Same run, same pipeline: the baseline is the video engine alone (``VideoEngine.submit`` ->
first decoded segment, and the whole decode), the measured side a WebSocket client over
127.0.0.1 against the server (``session.start`` -> first ``video.chunk_metadata`` + binary,
then every chunk). ``overhead`` = first chunk - first decoded segment (target: <= 100 ms);
``delivery`` = video seconds delivered / wall seconds from the first chunk to the last
(target: >= 1, at least as fast as playback).

Model: the tests' tiny random Wan pipeline (CPU run here), or ``--weights FOLDER`` (a Wan
``save_pretrained`` folder) with ``--device cuda``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_video_stream.py --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import websockets

from rtserve.app import build_app
from rtserve.config import load_config
from rtserve.engines.diffusion.video_engine import VideoEngine
from rtserve.engines.diffusion.video_request import VideoRequest
from tests.engines.diffusion.tiny_video_pipeline import write_tiny_wan
from tests.support import serve_app

RESULTS = Path(__file__).resolve().parent / "results" / "bench_video_stream.json"


async def engine_alone(config: Any, request: VideoRequest) -> tuple[float, float]:
    """Seconds to the first decoded segment and to the last, the engine called directly."""
    engine = VideoEngine(config)
    await engine.start()
    try:
        start = time.perf_counter()
        first = 0.0
        async for _ in engine.submit(request).segments():
            first = first or time.perf_counter() - start
        return first, time.perf_counter() - start
    finally:
        await engine.stop()


async def stream_once(url: str, start_event: dict[str, Any]) -> tuple[float, float, int]:
    """Seconds to the first chunk, to the last chunk, and frames received."""
    async with websockets.connect(url, max_size=None) as ws:
        sent = time.perf_counter()
        await ws.send(json.dumps(start_event))
        first = last = 0.0
        frames = 0
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "video.chunk_metadata":
                await ws.recv()
                last = time.perf_counter() - sent
                first = first or last
                frames += event["frames"]
            elif event["type"] in ("session.done", "error"):
                assert event["type"] == "session.done", event
                return first, last, frames


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", help="a Wan pipeline folder (default: the tests' tiny random one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights or str(write_tiny_wan(Path(tmp) / "tiny-wan"))
        config = load_config(
            environ={},
            overrides={
                "engine": "loopback",
                "video_engine": {"weights": weights, "device": args.device},
                "videos": {"store_dir": str(Path(tmp) / "store")},
            },
        )
        request = VideoRequest("a cat", args.width, args.height, args.frames, args.steps, 1.0, seed=0)
        alone = [await engine_alone(config, request) for _ in range(args.runs)]
        start_event = {
            "type": "session.start",
            "prompt": "a cat",
            "width": args.width,
            "height": args.height,
            "num_frames": args.frames,
            "fps": args.fps,
            "num_inference_steps": args.steps,
            "guidance_scale": 1.0,
            "seed": 0,
        }
        async with serve_app(build_app(config)) as base:
            url = base.replace("http://", "ws://") + "/v1/realtime/video"
            streamed = []
            for _ in range(args.runs + 1):
                try:
                    streamed.append(await stream_once(url, start_event))
                except AssertionError:  # the engine still loading: model_not_ready
                    await asyncio.sleep(0.5)
            streamed = streamed[-args.runs :]
    first_segment = statistics.median(a[0] for a in alone)
    first_chunk = statistics.median(s[0] for s in streamed)
    delivery = statistics.median((s[2] / args.fps) / max(s[1] - s[0], 1e-9) for s in streamed)
    rows = {
        "engine alone: first decoded segment (s)": first_segment,
        "engine alone: whole video decoded (s)": statistics.median(a[1] for a in alone),
        "WS: first chunk (s)": first_chunk,
        "WS: last chunk (s)": statistics.median(s[1] for s in streamed),
        "overhead: first chunk - first segment (ms)": (first_chunk - first_segment) * 1000,
        "delivery: video s / wall s after the first chunk": delivery,
    }
    print(f"{'measure':<52} {'value':>10}")
    for name, value in rows.items():
        print(f"{name:<52} {value:>10.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"args": vars(args), "machine": platform.platform(), "torch": torch.__version__, **rows}, indent=2)
    )


if __name__ == "__main__":
    asyncio.run(main())
