"""Streaming video output: how soon ``WS /v1/realtime/video`` sends the first fMP4 chunk after
the first segment is decoded, and whether chunks arrive at least as fast as playback (issue 36).

Same run, same pipeline: the baseline is the video engine alone (``VideoEngine.submit`` ->
first decoded segment, and the whole decode), the measured side a WebSocket client over
127.0.0.1 against the server (``session.start`` -> first ``video.chunk_metadata`` + binary,
then every chunk). ``overhead`` = first chunk - first decoded segment (target: <= 100 ms);
``delivery`` = video seconds delivered / wall seconds from the first chunk to the last
(target: >= 1, at least as fast as playback).

Models (both sides load the same ``save_pretrained`` folder, as the server does):

* ``--shape tiny`` (default): the tests' tiny random Wan pipeline, for a CPU run here;
* ``--shape wan-1.3b``: Wan2.1-T2V-1.3B's published shapes (transformer, VAE and scheduler from
  ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``' configs written below) with random weights, no download.
  The text encoder is NOT umt5-xxl (~5.7B): a random UMT5 of its width (4096, what the
  transformer's text projection takes) with 2 of its 24 layers. It runs once per request, before
  the first step; what this measures is denoising, decoding and delivery;
* ``--weights FOLDER``: a real Wan pipeline folder.

A warm-up generation runs on each side before the measured ones (CUDA kernels, allocator).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_video_stream.py --threads 1
    PYTHONPATH=$PWD python3 benchmarks/bench_video_stream.py --shape wan-1.3b --device cuda --dtype bfloat16 \
        --width 832 --height 480 --frames 33 --steps 8 --guidance-scale 5.0
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
from rtserve.engines.torch_dtypes import DTYPES
from rtserve.errors import MODEL_NOT_READY
from tests.engines.diffusion.tiny_video_pipeline import tiny_wan_pipeline, write_tiny_wan
from tests.support import serve_app

RESULTS = Path(__file__).resolve().parent / "results" / "bench_video_stream.json"
OVERHEAD_TARGET_MS = 100.0

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json (WanTransformer3DModel): 1.3B parameters.
WAN_1_3B_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}
# vae/config.json (AutoencoderKLWan; its latents_mean / latents_std are the class defaults).
WAN_1_3B_VAE: dict[str, Any] = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}
# scheduler/scheduler_config.json (UniPCMultistepScheduler over flow sigmas).
WAN_1_3B_SCHEDULER: dict[str, Any] = {
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
    "solver_order": 2,
    "solver_type": "bh2",
    "predict_x0": True,
    "lower_order_final": True,
    "final_sigmas_type": "zero",
}
# google/umt5-xxl's width (the transformer's text_dim), 2 of its 24 layers: see the module note.
UMT5_XXL_WIDTH: dict[str, Any] = {
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_heads": 64,
    "feed_forward_proj": "gated-gelu",
    "num_layers": 2,
}


def write_wan_1_3b(folder: Path, device: torch.device, dtype: torch.dtype) -> Path:
    """Wan2.1-T2V-1.3B's shapes with random weights (built on ``device``), saved under ``folder``."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = tiny_wan_pipeline().tokenizer  # the tests' word-level UMT5 tokenizer: no download
    torch.manual_seed(0)
    # diffusers' constructors are unannotated (``register_to_config``), their models' types do not
    # show torch's ``to``, and transformers types ``to`` for a PreTrainedModel argument: all Any here.
    with torch.device(device):  # random init on the GPU: seconds, not minutes on the host
        transformer: Any = WanTransformer3DModel(**WAN_1_3B_TRANSFORMER)  # type: ignore[no-untyped-call]
        vae: Any = AutoencoderKLWan(**WAN_1_3B_VAE)  # type: ignore[no-untyped-call]
        text_encoder: Any = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **UMT5_XXL_WIDTH))
    pipe: Any = WanPipeline(  # type: ignore[no-untyped-call]
        tokenizer=tokenizer,
        text_encoder=text_encoder.to(dtype),
        vae=vae.to(dtype),
        transformer=transformer.to(dtype),
        # its tables stay on the host
        scheduler=UniPCMultistepScheduler(**WAN_1_3B_SCHEDULER),  # type: ignore[no-untyped-call]
    )
    pipe.save_pretrained(folder)
    return folder


async def engine_alone(config: Any, request: VideoRequest, runs: int) -> list[tuple[float, float]]:
    """Per run, seconds to the first decoded segment and to the last, the engine called directly
    (after one warm-up run)."""
    engine = VideoEngine(config)
    await engine.start()
    if engine.failure:
        raise SystemExit(engine.failure)
    try:
        times = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            first = 0.0
            async for _ in engine.submit(request).segments():
                first = first or time.perf_counter() - start
            times.append((first, time.perf_counter() - start))
        return times[1:]
    finally:
        await engine.stop()


class NotReady(Exception):
    """The server's video engine is still loading (``model_not_ready``)."""


async def stream_once(url: str, start_event: dict[str, Any]) -> tuple[list[tuple[float, int]], float]:
    """Each chunk's arrival (seconds after ``session.start``) with its frame count, and ``session.done``'s."""
    async with websockets.connect(url, max_size=None) as ws:
        sent = time.perf_counter()
        await ws.send(json.dumps(start_event))
        chunks = []
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "video.chunk_metadata":
                await ws.recv()
                chunks.append((time.perf_counter() - sent, event["frames"]))
            elif event["type"] == "session.done":
                return chunks, time.perf_counter() - sent
            elif event["type"] == "error":
                if event["code"] == MODEL_NOT_READY:
                    raise NotReady
                raise SystemExit(f"the stream failed: {event}")


async def stream_runs(url: str, start_event: dict[str, Any], runs: int) -> list[list[tuple[float, int]]]:
    """``runs`` streams after the engine has loaded and one warm-up stream."""
    while True:
        try:
            await stream_once(url, start_event)
            break
        except NotReady:
            await asyncio.sleep(0.5)
    return [(await stream_once(url, start_event))[0] for _ in range(runs)]


def lateness(chunks: list[tuple[float, int]], fps: int) -> float:
    """How late the worst chunk came for a player that starts at the first chunk (seconds;
    <= 0: playback never waits): chunk i is due when the frames before it have played."""
    start, shown = chunks[0][0], chunks[0][1]
    worst = float("-inf")
    for arrival, frames in chunks[1:]:
        if frames:  # the closing chunk holds no frames: nothing is due
            worst = max(worst, arrival - (start + shown / fps))
        shown += frames
    return worst


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["tiny", "wan-1.3b"], default="tiny")
    parser.add_argument("--weights", help="a real Wan pipeline folder instead of --shape")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--guidance-scale", type=float, default=1.0, help="above 1: two transformer rows per step")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        if args.weights:
            weights = args.weights
        elif args.shape == "wan-1.3b":
            weights = str(write_wan_1_3b(Path(tmp) / "wan-1.3b-random", device, DTYPES[args.dtype]))
        else:
            weights = str(write_tiny_wan(Path(tmp) / "tiny-wan"))
        config = load_config(
            environ={},
            overrides={
                "engine": "loopback",
                "video_engine": {"weights": weights, "device": args.device, "dtype": args.dtype},
                "videos": {"store_dir": str(Path(tmp) / "store")},
            },
        )
        request = VideoRequest("a cat", args.width, args.height, args.frames, args.steps, args.guidance_scale, seed=0)
        alone = await engine_alone(config, request, args.runs)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        start_event = {
            "type": "session.start",
            "prompt": "a cat",
            "width": args.width,
            "height": args.height,
            "num_frames": args.frames,
            "fps": args.fps,
            "num_inference_steps": args.steps,
            "guidance_scale": args.guidance_scale,
            "seed": 0,
        }
        async with serve_app(build_app(config)) as base:
            streamed = await stream_runs(
                base.replace("http://", "ws://") + "/v1/realtime/video", start_event, args.runs
            )
    first_segment = statistics.median(a[0] for a in alone)
    first_chunk = statistics.median(s[0][0] for s in streamed)
    overhead_ms = (first_chunk - first_segment) * 1000
    delivery = statistics.median((sum(f for _, f in s) / args.fps) / max(s[-1][0] - s[0][0], 1e-9) for s in streamed)
    late_ms = max(lateness(s, args.fps) for s in streamed) * 1000
    rows: dict[str, tuple[float, str]] = {
        "engine alone: first decoded segment (s)": (first_segment, ""),
        "engine alone: whole video decoded (s)": (statistics.median(a[1] for a in alone), ""),
        "WS: first chunk (s)": (first_chunk, ""),
        "WS: last chunk (s)": (statistics.median(s[-1][0] for s in streamed), ""),
        "overhead: first chunk - first segment (ms)": (
            overhead_ms,
            f"<= {OVERHEAD_TARGET_MS:g}: {'met' if overhead_ms <= OVERHEAD_TARGET_MS else 'NOT met'}",
        ),
        "delivery: video s / wall s after the first chunk": (
            delivery,
            f">= 1: {'met' if delivery >= 1 else 'NOT met'}",
        ),
        "worst chunk lateness vs playback (ms, all runs)": (late_ms, f"<= 0: {'met' if late_ms <= 0 else 'NOT met'}"),
    }
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    print(
        f"\nvideo: {args.weights or args.shape} {args.width}x{args.height}, {args.frames} frames at {args.fps} fps, "
        f"{args.steps} steps, guidance {args.guidance_scale}, {device_name} {args.dtype}, median of {args.runs} runs"
    )
    print(f"{'measure':<52} {'value':>10}  target")
    for name, (value, target) in rows.items():
        print(f"{name:<52} {value:>10.3f}  {target}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "args": {**vars(args), "json": str(args.json)},
                "machine": platform.platform(),
                "device_name": device_name,
                "torch": torch.__version__,
                **{name: value for name, (value, _) in rows.items()},
                "runs": {"engine_alone": alone, "ws_chunks": streamed},
            },
            indent=2,
        )
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
