"""Kyutai STT frame step, rtserve's ``SttFrameModel`` vs the reference ``moshi`` 0.2.13 ``LMGen``
batched by hand, in one run on the same random weights: p50/p99 ms per 80 ms frame at batch B.

One frame = Mimi encode of B frames of audio + one temporal step (no depformer) + the extra
heads (end-of-turn probabilities) + the copy of the text tokens and probabilities to the host.
Ours is the served path (``SttFrameModel.step``: one CUDA graph per attention span on a GPU,
per-row host readout into ``FrameOutput``s); ``ours-paged8`` the same with paged int8 KV,
``ours-paged4`` with 4-bit KV. The
reference is what Kyutai's scripts run, batched: its streaming ``MimiModel.encode`` and
``LMGen.step_with_extra_heads`` (its own CUDA graphs and compiled glue), tokens and heads
copied to the host. Contexts: ``0`` (fresh rows) and ``full`` (every row's attention window
full: the steady state of a stream longer than ``context`` frames), set directly in the KV
caches on both sides (``moshi_build``). ``mimi-encode`` times our Mimi encode alone (its own
graph): the share of a frame that is the codec, not the LM; ``mimi-encode-bf16`` the same
codec with its encoder in bf16, with its code agreement against fp32; ``ours-paged8-codec-bf16``
the served step with the encoder in bf16 and the quantizer in fp32 (``stt_engine.codec_dtype:
bfloat16``); ``ours-paged8-device`` the paged step without the per-row host readout. These four
are off by default; the last two are diagnostics.

Shapes: the published configs (``config.json`` of each hub repo) as ``SHAPES`` transcribes them,
with random bf16 weights; Mimi in fp32 with 32 codebooks, as published. ``tiny`` (CPU) keeps
the script testable.

    python benchmarks/bench_kyutai_stt.py                       # CUDA: both shapes, B = 64, 256, 512
    python benchmarks/bench_kyutai_stt.py --shapes stt-1b --batches 256
    python benchmarks/bench_kyutai_stt.py --shapes stt-1b --batches 256 --fills full --rounds 5
    .venv/bin/python benchmarks/bench_kyutai_stt.py             # CPU: tiny shape, B = 1, 2

``--rounds N`` runs the sides in turn N times and reports the medians and the median of the
per-round ratios: the reference, launched eagerly from Python in part, moves with the host's
load by up to a third between runs of one call, ours (replayed CUDA graphs) by a few percent.

Prints a table; JSON to ``benchmarks/results/bench_kyutai_stt.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from moshi_build import (
    build_lm,
    build_mimi,
    merge_rounds,
    mimi_config,
    prefill_ours,
    prefill_paged,
    prefill_reference,
    print_kernels,
    time_steps,
)

from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_stt.loader import stt_model
from rtserve.engines.moshi.cuda_graph import capture_graphs
from rtserve.engines.moshi.frame_step import FrameStep
from rtserve.engines.moshi.lm_config import MimiConfig
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.paged_kv import PagedKVSpec
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.moshi.weights import CheckpointExtras
from rtserve.engines.values import SlotPrompt

RESULTS = Path(__file__).parent / "results" / "bench_kyutai_stt.json"
FRAME_SIZE = 1920
PAGED_BLOCK = 64
AGREEMENT_FRAMES = 25

# The published LM configs (hub ``config.json``; keys the reference ``LMModel`` takes). Values
# transcribed from public copies of those files: kyutai/stt-2.6b-en (revision pinned in a public
# parity tool that checks the whole file), kyutai/stt-1b-en_fr (layer/width/head/context/vocabulary
# values from a public port that states them as read from config.json; extra heads 4 x 6 as the
# published candle checkpoint carries them). Both: delays all 0 (the text delay is in the data),
# ``stt_config`` audio delay / silence prefix as published.
_COMMON: dict[str, Any] = {
    "card": 2048,
    "n_q": 32,
    "dep_q": 0,
    "delays": [0] * 33,
    "dim": 2048,
    "existing_text_padding_id": 3,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "max_period": 100000.0,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_num_heads": 16,
    "depformer_num_layers": 6,
    "depformer_dim_feedforward": None,
    "depformer_multi_linear": True,
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
}
SHAPES: dict[str, tuple[dict[str, Any], dict[str, float]]] = {
    "stt-1b": (
        dict(
            _COMMON,
            text_card=8000,
            num_heads=16,
            num_layers=16,
            context=750,
            extra_heads_num_heads=4,
            extra_heads_dim=6,
        ),
        {"audio_delay_seconds": 0.5, "audio_silence_prefix_seconds": 0.0},
    ),
    "stt-2.6b": (
        dict(_COMMON, text_card=4000, num_heads=32, num_layers=48, context=375),
        {"audio_delay_seconds": 2.5, "audio_silence_prefix_seconds": 1.0},
    ),
    "tiny": (
        dict(
            _COMMON,
            dim=64,
            text_card=128,
            n_q=8,
            delays=[0] * 9,
            card=64,
            num_heads=4,
            num_layers=2,
            context=40,
            extra_heads_num_heads=2,
            extra_heads_dim=6,
        ),
        {"audio_delay_seconds": 0.5, "audio_silence_prefix_seconds": 0.0},
    ),
}


class RandomWeightsPieces:
    """The piece table ``SttFrameModel`` reads, for random weights (no tokenizer: every piece empty,
    so tokens cost the same host work as real ones but spell nothing)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def vocab_size(self) -> int:
        return self.size

    def id_to_piece(self, index: int) -> str:
        return ""


def release(lm: Any, mimi: Any, device: torch.device) -> None:
    lm.start(0)
    mimi.start(0)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_ours(
    lm: Any,
    mimi: Any,
    config: Any,
    stt: dict[str, float],
    batch: int,
    fill: int,
    bits: int,
    args: Any,
) -> dict[str, float]:
    """``bits``: 8 or 4 for paged KV of that width, 0 for the ring."""
    device = lm.text_linear.weight.device
    extras = CheckpointExtras(model_type="stt", stt_config=stt)
    pieces = RandomWeightsPieces(config.text_card)  # stands in for the SentencePiece tokenizer
    loaded = LoadedModel(lm, mimi, pieces, config, args.mimi_config, None, extras)  # type: ignore[arg-type]
    width = PagedKVSpec(1, PAGED_BLOCK).width(config.context)
    spec = PagedKVSpec(num_blocks=batch * width, block_size=PAGED_BLOCK, bits=bits) if bits else None
    model = SttFrameModel(stt_model(loaded), batch, paged_kv=spec)
    live = np.ones(batch, bool)
    for slot in range(batch):
        model.open_slot(slot, SlotPrompt())
    if spec is not None:
        prefill_paged(lm, np.full(batch, fill, np.int64))
    else:
        prefill_ours(lm, fill)
    model.frame.positions[:] = fill
    gen = np.random.default_rng(0)
    frames = (0.1 * gen.standard_normal((batch, FRAME_SIZE))).astype(np.float32)
    result = time_steps(lambda: model.step(frames, live), args.frames, args.warmup, device, args.profile)
    lm.transformer.use_paged_kv(None)
    return result


def run_encode(mimi: Any, batch: int, args: Any, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Our Mimi encode alone (a CUDA graph on a GPU): the part of a frame that is not the LM. With
    the encoder in bf16 (``stt_engine.codec_dtype: bfloat16``: a copy of the codec, its quantizer
    in fp32), also the share of its codes equal to the fp32 codec's on the same streamed audio (all
    codebooks, and the first: the semantic one)."""
    result: dict[str, float] = {}
    codec = mimi
    if dtype != torch.float32:
        codec = copy.deepcopy(mimi)
        codec.encoder_to(dtype)
        gen = torch.Generator(device="cpu").manual_seed(7)
        audio = [(torch.randn(batch, FRAME_SIZE, generator=gen) * 0.1).to(device) for _ in range(AGREEMENT_FRAMES)]
        mimi.start(batch)
        codec.start(batch)
        same = torch.stack([mimi.encode(x) == codec.encode(x) for x in audio]).float()
        result = {"codes_equal": float(same.mean()), "first_codebook_equal": float(same[:, :, 0].mean())}
    codec.start(batch)
    pcm = torch.randn(batch, FRAME_SIZE, device=device) * 0.1
    if device.type != "cuda":
        return result | time_steps(lambda: codec.encode(pcm), args.frames, args.warmup, device, args.profile)
    graph, _ = capture_graphs(lambda _: codec.encode(pcm), [0], device)[0]
    return result | time_steps(graph.replay, args.frames, args.warmup, device, args.profile)


def run_device_only(lm: Any, mimi: Any, config: Any, batch: int, fill: int, args: Any) -> dict[str, float]:
    """Paged int8 ``FrameStep`` replay and the token copy alone, without ``SttFrameModel``'s per-row
    host readout: the difference to ``ours-paged8`` is that readout."""
    device = lm.text_linear.weight.device
    spec = PagedKVSpec(num_blocks=batch * PagedKVSpec(1, PAGED_BLOCK).width(config.context), block_size=PAGED_BLOCK)
    lm.transformer.use_paged_kv(spec)
    sampler = SlotSampler(batch, device, MoshiSampling(use_sampling=False))
    frame = FrameStep(lm, mimi, sampler, batch, graph=device.type == "cuda")
    for row in range(batch):
        frame.admit(row)
    prefill_paged(lm, np.full(batch, fill, np.int64))
    frame.positions[:] = fill
    pcm = torch.randn(batch, FRAME_SIZE, device=device) * 0.1

    def step() -> None:
        out = frame(pcm)
        out.tokens[:, 0].cpu()

    result = time_steps(step, args.frames, args.warmup, device, args.profile)
    lm.transformer.use_paged_kv(None)
    return result


def run_reference(
    ref_lm: Any, ref_mimi: Any, batch: int, fill: int, args: Any, device: torch.device
) -> dict[str, float]:
    from moshi.models.lm import LMGen

    gen = LMGen(ref_lm, use_sampling=False)
    pcm = torch.randn(batch, 1, ref_mimi.frame_size, device=device) * 0.1

    def step() -> None:
        codes = ref_mimi.encode(pcm)
        out = gen.step_with_extra_heads(codes)
        if out is not None:
            out[0].cpu()
            if out[1]:  # the extra heads (none on stt-2.6b)
                torch.stack([head[:, 0] for head in out[1]], dim=1).float().cpu()

    with gen.streaming(batch), ref_mimi.streaming(batch):
        prefill_reference(ref_lm, fill)
        return time_steps(step, args.frames, args.warmup, device, args.profile)


def run_side(
    side: str, lm: Any, mimi: Any, ref_lm: Any, ref_mimi: Any, config: Any, stt: Any, batch: int, fill: int, args: Any
) -> dict[str, Any]:
    device = lm.text_linear.weight.device
    try:
        if side.startswith("mimi-encode"):
            codec_dtype = torch.bfloat16 if side == "mimi-encode-bf16" else torch.float32
            return run_encode(mimi, batch, args, device, codec_dtype)
        if side == "ours-paged8-device":
            return run_device_only(lm, mimi, config, batch, fill, args)
        if side == "ours-paged8-codec-bf16":
            codec = copy.deepcopy(mimi)
            codec.encoder_to(torch.bfloat16)
            return run_ours(lm, codec, config, stt, batch, fill, 8, args)
        if side == "reference":
            return run_reference(ref_lm, ref_mimi, batch, fill, args, device)
        bits = {"ours-paged8": 8, "ours-paged4": 4}.get(side, 0)
        return run_ours(lm, mimi, config, stt, batch, fill, bits, args)
    except torch.OutOfMemoryError:
        return {"skipped": "oom"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=None, help="comma list of " + ", ".join(SHAPES))
    parser.add_argument("--batches", default=None, help="comma list (default 64,256,512 on CUDA, 1,2 on CPU)")
    parser.add_argument("--fills", default="0,full", help="context fill: frames, or 'full' (the whole window)")
    parser.add_argument(
        "--sides",
        default="ours,ours-paged8,reference,mimi-encode",
        help="also: ours-paged4 (stt_engine.kv_cache: paged_int4), ours-paged8-codec-bf16 "
        "(stt_engine.codec_dtype: bfloat16); mimi-encode-bf16, "
        "ours-paged8-device (diagnostics)",
    )
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the sides in turn this many times; medians, and the median ratio"
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--profile", action="store_true", help="also print each side's top kernels (torch.profiler)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = (args.shapes or ("stt-1b,stt-2.6b" if cuda else "tiny")).split(",")
    batches = [int(b) for b in (args.batches or ("64,256,512" if cuda else "1,2")).split(",")]
    sides = args.sides.split(",")
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        kwargs, stt = SHAPES[shape]
        ref_lm, lm, config = build_lm(kwargs, device, dtype)
        mcfg = mimi_config("tiny" if shape == "tiny" else "full", kwargs["card"])
        if shape != "tiny":
            mcfg["quantizer"]["n_q"] = kwargs["n_q"]
        ref_mimi, mimi = build_mimi(mcfg, kwargs["n_q"], device)
        args.mimi_config = MimiConfig.from_dict(mcfg)
        for batch in batches:
            for fill_label in args.fills.split(","):
                fill = config.context if fill_label == "full" else int(fill_label)
                row: dict[str, Any] = {"shape": shape, "batch": batch, "fill": fill_label}
                runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
                for _ in range(args.rounds):
                    for side in sides:
                        runs[side].append(run_side(side, lm, mimi, ref_lm, ref_mimi, config, stt, batch, fill, args))
                        release(lm, mimi, device)
                        gc.collect()
                for side in sides:
                    row[side] = merge_rounds(runs[side], runs.get("reference") if side != "reference" else None)
                rows.append(row)
                for side in sides:
                    if "kernels" in row[side]:
                        print_kernels(f"{shape} B={batch} fill={fill_label} {side}", row[side].pop("kernels"))
                print(json.dumps(row), flush=True)
        del ref_lm, lm, ref_mimi, mimi
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    print_table(rows, sides, device)
    result = {
        "dtype": str(dtype),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "frames": args.frames,
        "warmup": args.warmup,
        "shapes": {s: SHAPES[s][0] for s in shapes},
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))


def print_table(rows: list[dict[str, Any]], sides: list[str], device: torch.device) -> None:
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"kyutai stt frame step, device={name}; ms/frame p50/p99; x = p50 / reference p50 (median over rounds)")
    print(f"{'shape':>9} {'B':>4} {'fill':>5}" + "".join(f" {side:>22}" for side in sides))
    for row in rows:
        ref = row.get("reference", {}).get("p50_ms")
        cells = []
        for side in sides:
            r = row.get(side, {})
            if "p50_ms" not in r:
                cells.append(f" {r.get('skipped', '-'):>22}")
                continue
            ratio = r.get("ratio_median", r["p50_ms"] / ref if ref else None)
            x = f" ({ratio:.2f}x)" if ratio and side != "reference" else ""
            cells.append(f" {r['p50_ms']:>7.2f}/{r['p99_ms']:<7.2f}{x:>8}")
        print(f"{row['shape']:>9} {row['batch']:>4} {row['fill']:>5}" + "".join(cells))


if __name__ == "__main__":
    main()
