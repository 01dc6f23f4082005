"""Image generation throughput: the step-batched image engine at concurrency 1 / 4 / 16 beside
the plain ``diffusers`` pipeline called one request at a time, in the same run (issue 36).

Both sides run the same pipeline object, prompts, sizes, steps and guidance. The plain side is
``pipe(prompt, ...)`` per request, back to back (what a server without step batching does). The
engine side is ``ImageEngine``: ``C`` clients each submit their requests one after another, so
``C`` requests are in flight at once and share each denoising step. Reported per concurrency:
images/s, the ratio to the plain pipeline, p50 / p95 latency (submit to decoded image), and the
engine's shared-step counters.

Models:

* ``--shape tiny`` (default): the tests' tiny random SD pipeline (64x64), for a CPU run here;
* ``--shape sdxl``: SDXL-base's published shapes (UNet, VAE, both CLIP text encoders, from
  ``stabilityai/stable-diffusion-xl-base-1.0``'s configs written below) with random weights;
  no download; meant for a GPU (``--device cuda --dtype float16``);
* ``--weights PATH_OR_REPO``: a real pipeline (folder or hub repo).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_images.py --threads 1
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_images.py --shape sdxl --device cuda --dtype bfloat16 \
        --size 1024 --steps 30 --requests-per-client 2
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

from rtserve.config import ServerConfig
from rtserve.engines.diffusion.image_engine import ImageEngine
from rtserve.engines.diffusion.service import ImageRequest
from rtserve.engines.torch_dtypes import DTYPES

RESULTS = Path(__file__).resolve().parent / "results" / "bench_images.json"

# stabilityai/stable-diffusion-xl-base-1.0, unet/config.json (the fields that shape compute).
SDXL_UNET: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280],
    "layers_per_block": 2,
    "transformer_layers_per_block": [1, 2, 10],
    "attention_head_dim": [5, 10, 20],
    "cross_attention_dim": 2048,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
    "norm_num_groups": 32,
}
# vae/config.json
SDXL_VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
    "force_upcast": True,
}
# text_encoder (CLIP ViT-L/14) and text_encoder_2 (OpenCLIP ViT-bigG/14) config.json
SDXL_TEXT = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12}
SDXL_TEXT_2 = {
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "projection_dim": 1280,
    "hidden_act": "gelu",
}
PROMPTS = [
    "a cup of coffee on the table",
    "a small robot reading beside a window",
    "a cat sitting on a windowsill",
    "a lighthouse on a cliff at dusk",
]


def sdxl_pipeline(device: torch.device, dtype: torch.dtype) -> Any:
    """SDXL-base's shapes with random weights, built on ``device`` (no download)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from tests.engines.diffusion.tiny_pipeline import tiny_tokenizer

    tokenizer = tiny_tokenizer(Path(tempfile.mkdtemp()))
    tokenizer.model_max_length = 77  # CLIP's context: the sequence length the UNet attends to
    vocab = len(tokenizer)

    def text(fields: dict[str, Any]) -> CLIPTextConfig:
        ids: dict[str, Any] = {"bos_token_id": vocab - 2, "eos_token_id": vocab - 1, "pad_token_id": vocab - 1}
        return CLIPTextConfig(vocab_size=vocab, max_position_embeddings=77, **ids, **fields)

    # The scheduler's tables stay on the host (diffusers reads them with numpy); the modules are
    # built on the device at once. diffusers' constructors are unannotated (``register_to_config``),
    # and a pipeline's components are registered at run time, so ``pipe`` is typed Any.
    scheduler = EulerDiscreteScheduler(  # type: ignore[no-untyped-call]  # unannotated in diffusers
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1
    )
    with torch.device(device):
        pipe: Any = StableDiffusionXLPipeline(  # type: ignore[no-untyped-call]  # unannotated in diffusers
            vae=AutoencoderKL(**SDXL_VAE),  # type: ignore[no-untyped-call]  # unannotated in diffusers
            text_encoder=CLIPTextModel(text(SDXL_TEXT)),
            text_encoder_2=CLIPTextModelWithProjection(text(SDXL_TEXT_2)),
            tokenizer=tokenizer,
            tokenizer_2=tokenizer,
            unet=UNet2DConditionModel(**SDXL_UNET),  # type: ignore[no-untyped-call]  # unannotated in diffusers
            scheduler=scheduler,
        )
    # float16: the pipeline and the engine both upcast SDXL's VAE themselves (force_upcast).
    for module in (pipe.vae, pipe.unet, pipe.text_encoder, pipe.text_encoder_2):
        module.to(dtype)
    return pipe


def build_pipeline(args: argparse.Namespace) -> Any:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    # The ignores below: diffusers leaves DiffusionPipeline.from_pretrained unannotated.
    if args.weights:
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(args.weights, dtype=dtype).to(device)  # type: ignore[no-untyped-call]
    elif args.shape == "sdxl":
        pipe = sdxl_pipeline(device, dtype)
    else:
        from diffusers import DiffusionPipeline

        from tests.engines.diffusion.tiny_pipeline import save_tiny_pipeline

        folder = save_tiny_pipeline(Path(tempfile.mkdtemp()))
        pipe = DiffusionPipeline.from_pretrained(folder, dtype=dtype).to(device)  # type: ignore[no-untyped-call]
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain(pipe: Any, requests: list[ImageRequest], device: torch.device) -> dict[str, float]:
    """The plain pipeline, one request at a time."""
    latencies = []
    start = time.perf_counter()
    for r in requests:
        began = time.perf_counter()
        pipe(
            r.prompt,
            height=r.height,
            width=r.width,
            num_inference_steps=r.steps,
            guidance_scale=r.guidance_scale,
            generator=torch.Generator().manual_seed(r.seed),
        )
        _sync(device)
        latencies.append(time.perf_counter() - began)
    wall = time.perf_counter() - start
    return {"images_per_s": len(requests) / wall, "p50_s": statistics.median(latencies), "p95_s": _p95(latencies)}


async def served(engine: ImageEngine, requests: list[ImageRequest], clients: int) -> dict[str, float]:
    """``clients`` clients, each submitting its share of ``requests`` one after another."""
    latencies: list[float] = []

    async def client(mine: list[ImageRequest]) -> None:
        for r in mine:
            began = time.perf_counter()
            [job] = engine.submit([r])
            await job.result()
            latencies.append(time.perf_counter() - began)

    before = engine.stats()
    start = time.perf_counter()
    await asyncio.gather(*(client(requests[i::clients]) for i in range(clients)))
    wall = time.perf_counter() - start
    after = engine.stats()
    assert before is not None and after is not None
    return {
        "images_per_s": len(requests) / wall,
        "p50_s": statistics.median(latencies),
        "p95_s": _p95(latencies),
        "denoiser_calls": after.steps - before.steps,
        "shared_calls": after.shared_steps - before.shared_steps,
        "request_steps": after.rows - before.rows,
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["tiny", "sdxl"], default="tiny")
    parser.add_argument("--weights", help="a real diffusers pipeline (folder or hub repo) instead of --shape")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--size", type=int, default=64, help="width = height")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance-scale", type=float, default=7.5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--plain-requests", type=int, default=8, help="requests for the plain baseline")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pipe = build_pipeline(args)

    def requests(count: int) -> list[ImageRequest]:
        return [
            ImageRequest(PROMPTS[i % len(PROMPTS)], args.size, args.size, args.steps, args.guidance_scale, seed=i)
            for i in range(count)
        ]

    requests(1)  # warm up both paths once (allocator, kernels)
    plain(pipe, requests(1), device)
    config = ServerConfig()
    config.image_engine.max_batch = max(args.concurrency)
    config.image_engine.max_queued = max(args.concurrency) * 2
    engine = ImageEngine(config, pipe)
    await engine.start()
    try:
        await served(engine, requests(2), 2)
        baseline = plain(pipe, requests(args.plain_requests), device)
        rows = {c: await served(engine, requests(c * args.requests_per_client), c) for c in args.concurrency}
    finally:
        await engine.stop()
    print(
        f"\nimages: {args.weights or args.shape} {args.size}x{args.size}, {args.steps} steps, "
        f"guidance {args.guidance_scale}, {args.device} {args.dtype}, torch threads {torch.get_num_threads()}"
    )
    header = ("", "img/s", "x plain", "p50 s", "p95 s", "calls", "shared", "req-steps")
    print(f"{header[0]:<16}" + "".join(f"{h:>11}" for h in header[1:]))
    table = {"plain diffusers": {**baseline, "ratio": 1.0}}
    table.update(
        {f"engine c={c}": {**row, "ratio": row["images_per_s"] / baseline["images_per_s"]} for c, row in rows.items()}
    )
    for name, row in table.items():
        cells = [f"{row[k]:.3f}" for k in ("images_per_s", "ratio", "p50_s", "p95_s")]
        cells += [f"{row[k]:.0f}" if k in row else "" for k in ("denoiser_calls", "shared_calls", "request_steps")]
        print(f"{name:<16}" + "".join(f"{cell:>11}" for cell in cells))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": platform.node(),
                "torch": torch.__version__,
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
                "plain": baseline,
                "engine": {str(c): row for c, row in rows.items()},
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())
