"""Kyutai TTS frame step, rtserve's ``KyutaiTTSModel`` vs the reference ``moshi`` 0.2.13
``TTSModel`` batched, in one run on the same random weights: p50/p99 ms per 80 ms frame at batch B.

One frame = the text-stream state machine for B rows + one temporal step (cross-attending to
each row's voice) + the depformer over every audio codebook + Mimi decode of the frame + its
audio, codes and flags copied to the host. Ours is ``KyutaiTTSModel.step`` (one CUDA graph on
a GPU, ``moshi.cuda_graph``); the reference is ``TTSModel.generate`` on B scripts (its
``LMGen`` with CUDA graphs and compiled glue, the state machine in Python per row), with the
streaming ``MimiModel.decode`` of each frame in its ``on_frame`` callback, as Kyutai's
streaming script does; a reference frame is the time between two callbacks. Both sample at
temperature 0.6 (top-k 250 audio / 25 text: the published ``lm_gen_config`` and the reference
defaults), CFG 2.0 as the distilled condition, one random voice per row; every row has ample text
(random word tokens), so every row steps every frame. The first ``--warmup`` frames (the audio
delay, where the reference skips its depformer) are not timed.
``--sides ours-pre-audio`` times our pre-audio step instead (every row inside its audio delay:
the depformer over the leading codebook(s) alone, no decoding; docs/engines.md#pre-audio-steps),
over the delay's frames after 3 warm-up steps.
``--sides ours-young-batch`` times that step in a young batch of B rows (a pre-audio-only model
on the same weights, attending over the delay's ring slots alone; docs/engines.md#young-batch).
``--open N`` opens only the first N of the B slots (a server sized for more replies than speak),
and ``--sides ours-buckets`` times our step computing only the slots in use, rounded up to
``--row-bucket``, with attention over the ring slots up to the rows' positions, rounded up to
``--span-bucket`` (docs/engines.md#row-buckets); ``ours`` computes every slot over the whole ring:

    python benchmarks/bench_kyutai_tts.py --batches 256 --open 96 --sides ours,ours-buckets

``--sides ours-codec-bf16`` times our step with Mimi's decoder in bf16
(docs/engines.md#mimi-decoder-in-bf16).

Shape: kyutai/tts-1.6b-en_fr's ``config.json`` as ``TTS_1_6B`` transcribes it, random bf16
weights; Mimi fp32, 32 codebooks. ``tiny`` (CPU) keeps the script testable.

    python benchmarks/bench_kyutai_tts.py                        # CUDA: B = 16, 64, 128
    .venv/bin/python benchmarks/bench_kyutai_tts.py              # CPU: tiny shape, B = 1, 2

Prints a table; JSON to ``benchmarks/results/bench_kyutai_tts.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from moshi_build import build_mimi, kernel_profile, mimi_config, print_kernels, summary, sync
from safetensors.torch import save_file

from rtserve.engines.kyutai_tts.conditioning import Conditioners, conditioner_rename, voice_layout
from rtserve.engines.kyutai_tts.config import TTSArch
from rtserve.engines.kyutai_tts.lm import TTSLM, tts_rename
from rtserve.engines.kyutai_tts.loader import LoadedTTS
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, TTSSettings
from rtserve.engines.moshi.checkpoint import load_into
from rtserve.engines.moshi.lm_config import MimiConfig

RESULTS = Path(__file__).parent / "results" / "bench_kyutai_tts.json"
TEMPERATURE = 0.6
CFG = 2.0
WORD_TOKENS = 3

# kyutai/tts-1.6b-en_fr config.json (hub revision f65439609986c392cb12df63938abcc550c3fb15), as a
# public inspection tool pins and checks it key by key.
TTS_1_6B: dict[str, Any] = {
    "card": 2048,
    "n_q": 32,
    "dep_q": 32,
    "delays": [0, 0] + [2] * 31,
    "dim": 2048,
    "text_card": 8000,
    "existing_text_padding_id": 3,
    "num_heads": 16,
    "num_layers": 16,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 500,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_num_heads": 16,
    "depformer_num_layers": 4,
    "depformer_dim_feedforward": 3072,
    "depformer_multi_linear": True,
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "depformer_weights_per_step_schedule": list(range(8)) + [8] * 8 + [9] * 8 + [10] * 8,
    "depformer_low_rank_embeddings": 128,
    "demux_second_stream": True,
    "text_card_out": None,
    "cross_attention": True,
    "conditioners": {
        "speaker_wavs": {"type": "tensor", "tensor": {"dim": 512}},
        "cfg": {
            "type": "lut",
            "lut": {
                "n_bins": 7,
                "dim": 16,
                "tokenizer": "noop",
                "possible_values": ["1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0"],
            },
        },
        "control": {"type": "lut", "lut": {"dim": 2048, "n_bins": 1, "tokenizer": "noop", "possible_values": ["ok"]}},
    },
    "fuser": {
        "cross_attention_pos_emb": True,
        "cross_attention_pos_emb_scale": 1,
        "sum": ["control", "cfg"],
        "prepend": [],
        "cross": ["speaker_wavs"],
    },
    "tts_config": {"audio_delay": 1.28, "second_stream_ahead": 2},
    "model_id": {"sig": "1e68beda", "epoch": 240},
    "model_type": "tts",
}
VOICE_FRAMES = 125  # frames of a published voice embedding ([1, 512, 125])


def tiny_config() -> dict[str, Any]:
    raw = copy.deepcopy(TTS_1_6B)
    raw.update(
        dim=32,
        text_card=64,
        n_q=8,
        dep_q=8,
        card=64,
        num_heads=4,
        num_layers=2,
        context=50,
        delays=[0, 0] + [2] * 7,
        depformer_dim=16,
        depformer_dim_feedforward=66,
        depformer_num_heads=2,
        depformer_num_layers=2,
        depformer_weights_per_step_schedule=[0, 1, 2, 2, 3, 3, 3, 3],
        depformer_low_rank_embeddings=8,
        tts_config={"audio_delay": 0.4, "second_stream_ahead": 2},
    )
    raw["conditioners"]["speaker_wavs"]["tensor"]["dim"] = 16
    raw["conditioners"]["control"]["lut"]["dim"] = 8
    return raw


def random_reference_tts_lm(raw: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """The reference TTS LM of ``raw`` with its conditioners, every weight random (seeded)."""
    from moshi.models.loaders import get_moshi_lm

    torch.manual_seed(0)
    lm_kwargs = {k: copy.deepcopy(v) for k, v in raw.items() if k not in ("tts_config", "model_id", "model_type")}
    ref_lm = get_moshi_lm(None, lm_kwargs=lm_kwargs, device=device, dtype=dtype).eval()
    with torch.no_grad():
        for param in ref_lm.parameters():
            param.normal_(0, 1.0 / max(param.shape[-1], 1) ** 0.5)
    return ref_lm


def build(
    raw: dict[str, Any], shape: str, device: torch.device, dtype: torch.dtype, codebooks: int
) -> tuple[Any, Any, LoadedTTS]:
    """The reference LM (random weights) and Mimi, and ours loaded from them (Mimi with the first
    ``codebooks`` codebooks, which both sides generate)."""
    ref_lm = random_reference_tts_lm(raw, device, dtype)
    arch = TTSArch.from_dict(raw)
    state = ref_lm.state_dict()
    with torch.device("meta"):
        lm = TTSLM(arch)
        conditioners = Conditioners(arch)
    lm.to_empty(device=device)
    load_into(lm, state, Path("reference-tts-lm"), tts_rename(arch), dtype=dtype)
    conditioners.to_empty(device=device)
    load_into(conditioners, state, Path("reference-tts-lm"), conditioner_rename, dtype=torch.float32)
    mcfg = mimi_config("tiny" if shape == "tiny" else "full", raw["card"])
    ref_mimi, mimi = build_mimi(mcfg, codebooks, device)
    no_tokenizer: Any = None  # scripts are given as token ids
    loaded = LoadedTTS(lm.eval(), conditioners.eval(), mimi, no_tokenizer, arch, MimiConfig.from_dict(mcfg), None)
    return ref_lm, ref_mimi, loaded


def words(raw: dict[str, Any], count: int, seed: int) -> list[list[int]]:
    gen = np.random.default_rng(seed)
    return [gen.integers(10, raw["text_card"], WORD_TOKENS).tolist() for _ in range(count)]


def run_ours(
    loaded: LoadedTTS,
    raw: dict[str, Any],
    voice: torch.Tensor,
    batch: int,
    args: Any,
    *,
    speak: bool = True,
    young_batch: bool = False,
    row_bucket: int = 0,
    span_bucket: int = 0,
    codec_dtype: torch.dtype = torch.float32,
) -> dict[str, float]:
    """``speak`` False: the pre-audio step of rows inside their audio delay, which lasts
    ``young_steps`` frames: 3 warm-up steps and at most the rest timed. ``young_batch``: that
    step in a young batch of ``batch`` rows (a pre-audio-only model). The first ``args.open``
    slots are open (all where None)."""
    device = loaded.lm.text_linear.weight.device
    settings = TTSSettings(temperature=TEMPERATURE, cfg_coef=CFG, voice_frames=VOICE_FRAMES)
    if codec_dtype != torch.float32:  # a copy of the codec: the other sides keep theirs in fp32
        loaded = replace(loaded, mimi=copy.deepcopy(loaded.mimi))
        loaded.mimi.decoder_to(codec_dtype)
    if young_batch:
        model = KyutaiTTSModel(loaded.sharing_weights(), batch, settings=settings, pre_audio_only=True)
    else:
        model = KyutaiTTSModel(loaded, batch, settings=settings, row_bucket=row_bucket, span_bucket=span_bucket)
    layout = voice_layout([voice])
    open_slots = min(args.open or batch, batch)
    for slot in range(open_slots):
        model.open_slot(slot, layout, seed=slot)
        for tokens in words(raw, settings.max_words, slot):
            model.push_word(slot, tokens, 0)
    times = []
    warmup, timed = (args.warmup, args.frames) if speak else (3, min(args.frames, model.young_steps - 3))
    for i in range(warmup + timed):
        sync(device)
        start = time.perf_counter()
        frames = model.step(speak=speak)
        sync(device)
        if i >= warmup:
            times.append(1000 * (time.perf_counter() - start))
    assert all(frame is not None and frame.stepped for frame in frames[:open_slots]), "a row waited: too little text"
    result: dict[str, Any] = dict(summary(times), step_rows=model.step_rows, step_span=model.step_span)
    if args.profile:
        result["kernels"] = kernel_profile(lambda: model.step(speak=speak), timed, device)
    return result


class _Enough(Exception):
    """Raised from the reference's frame callback once enough frames are timed."""


def run_reference(
    ref_lm: Any, ref_mimi: Any, raw: dict[str, Any], voice: Path, batch: int, args: Any, codebooks: int
) -> dict[str, float]:
    from moshi.models.tts import Entry, StateMachine, TokenIds, TTSModel

    device = next(ref_lm.parameters()).device
    delay_steps = int(raw["tts_config"]["audio_delay"] * 12.5)
    tts = TTSModel(
        lm=ref_lm,
        mimi=ref_mimi,
        tokenizer=None,  # type: ignore[arg-type]  # scripts are given as token ids
        voice_suffix="",
        voice_repo="",
        machine=StateMachine(TokenIds(raw["text_card"] + 1), second_stream_ahead=2, max_padding=8, initial_padding=2),
        delay_steps=delay_steps,
        temp=TEMPERATURE,
        cfg_coef=1.0,
        n_q=codebooks,
        final_padding=4,
    )
    entries = [[Entry(tokens, "w", 0) for tokens in words(raw, 200, row)] for row in range(batch)]
    attributes = [tts.make_condition_attributes([voice], cfg_coef=CFG)] * batch
    stamps: list[float] = []

    def on_frame(frame: torch.Tensor) -> None:
        if len(stamps) > delay_steps:  # the audio delay has passed: the frame holds real codes
            ref_mimi.decode(frame[:, 1:, :]).cpu()
        frame.cpu()
        sync(device)
        stamps.append(time.perf_counter())
        if len(stamps) > args.warmup + args.frames:
            raise _Enough

    with ref_mimi.streaming(batch):
        with contextlib.suppress(_Enough):
            tts.generate(entries, attributes, on_frame=on_frame)
    gaps = np.diff(stamps) * 1000
    return summary(gaps[args.warmup :].tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default=None, help="comma list (default 16,64,128 on CUDA, 1,2 on CPU)")
    parser.add_argument(
        "--sides",
        default="ours,reference",
        help="ours, ours-pre-audio (a reply's step before its audio), ours-young-batch (that step in a young "
        "batch of B rows), ours-buckets (ours computing the slots in use only), ours-codec-bf16 (Mimi's decoder "
        "in bf16), reference",
    )
    parser.add_argument("--open", type=int, help="slots open of each batch (default: all)")
    parser.add_argument("--row-bucket", type=int, default=32, help="ours-buckets: rows a step computes, rounded up")
    parser.add_argument("--span-bucket", type=int, default=128, help="ours-buckets: ring slots attention reads")
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=22, help="untimed frames (the audio delay is 16)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--profile", action="store_true", help="also print our step's top kernels (torch.profiler)")
    parser.add_argument(
        "--codebooks", type=int, help="audio codebooks both sides generate (default: all; Kyutai's servers run 24)"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = "tts-1.6b" if cuda else "tiny"
    raw = TTS_1_6B if cuda else tiny_config()
    batches = [int(b) for b in (args.batches or ("16,64,128" if cuda else "1,2")).split(",")]
    sides = args.sides.split(",")
    codebooks = args.codebooks or raw["n_q"]
    ref_lm, ref_mimi, loaded = build(raw, shape, device, dtype, codebooks)
    voice_dim = raw["conditioners"]["speaker_wavs"]["tensor"]["dim"]
    voice = torch.randn(1, voice_dim, VOICE_FRAMES, generator=torch.Generator().manual_seed(1))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        voice_file = Path(folder) / "voice.safetensors"
        save_file({"speaker_wavs": voice}, str(voice_file))
        for batch in batches:
            row: dict[str, Any] = {"shape": shape, "batch": batch, "open": min(args.open or batch, batch)}
            for side in sides:
                try:
                    if side == "reference":
                        row[side] = run_reference(ref_lm, ref_mimi, raw, voice_file, batch, args, codebooks)
                    else:
                        young = side == "ours-young-batch"
                        speak = side not in ("ours-pre-audio", "ours-young-batch")
                        bucketed = side == "ours-buckets"
                        row[side] = run_ours(
                            loaded,
                            raw,
                            voice,
                            batch,
                            args,
                            speak=speak,
                            young_batch=young,
                            row_bucket=args.row_bucket if bucketed else 0,
                            span_bucket=args.span_bucket if bucketed else 0,
                            codec_dtype=torch.bfloat16 if side == "ours-codec-bf16" else torch.float32,
                        )
                except torch.OutOfMemoryError:
                    row[side] = {"skipped": "oom"}
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
            rows.append(row)
            for side in sides:
                if "kernels" in row[side]:
                    print_kernels(f"B={batch} {side}", row[side].pop("kernels"))
            print(json.dumps(row), flush=True)
    print_table(rows, sides, device, codebooks)
    result = {
        "shape": shape,
        "dtype": str(dtype),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "frames": args.frames,
        "warmup": args.warmup,
        "codebooks": codebooks,
        "config": raw,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))


def print_table(rows: list[dict[str, Any]], sides: list[str], device: torch.device, codebooks: int) -> None:
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    base = "reference" if "reference" in sides else sides[0]
    print(f"kyutai tts frame step, device={name}, {codebooks} codebooks; ms/frame p50/p99; x = p50 / {base} p50")
    print(f"{'shape':>9} {'B':>4} {'open':>4}" + "".join(f" {side:>22}" for side in sides))
    for row in rows:
        ref = row.get(base, {}).get("p50_ms")
        cells = []
        for side in sides:
            r = row.get(side, {})
            if "p50_ms" not in r:
                cells.append(f" {r.get('skipped', '-'):>22}")
                continue
            x = f" ({r['p50_ms'] / ref:.2f}x)" if ref and side != base else ""
            cells.append(f" {r['p50_ms']:>7.2f}/{r['p99_ms']:<7.2f}{x:>8}")
        print(f"{row['shape']:>9} {row['batch']:>4} {row['open']:>4}" + "".join(cells))


if __name__ == "__main__":
    main()
