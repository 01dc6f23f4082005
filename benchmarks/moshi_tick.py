"""Moshi per-frame tick, rtserve engine vs the reference ``moshi`` package, side by side:
p50/p99 ms per frame and peak GPU memory at batch B, KV ring R and context fill F.

One frame = Mimi encode of B user frames + one temporal step + ``dep_q`` depformer steps
+ Mimi decode of B agent frames, then the token copy to the host. Ours runs as one CUDA
graph per batch (``FrameStep(graph=True)``); the reference as its own ``LMGen`` and
``MimiModel`` streaming with their CUDA graphs. Both sides use the same random weights
(``moshi_build``). A fill of F frames is set directly in the temporal KV caches (random
keys/values, positions advanced by F) rather than by stepping F frames; a fill past the
ring means a full, wrapped ring.

``ours-paged8`` is our engine with paged int8 KV (``Transformer.use_paged_kv``): sessions may
grow to the model's context (3000 frames) whatever the ring column says, blocks come from one
pool sized to the free memory, and attention reads only the blocks each row holds. Its extra
fill ``mixN`` spreads the rows' fills evenly over 0..2N (average N), the issue's 256-session
case; a fill whose blocks do not fit in the pool is skipped (``"skipped": "kv pool"``).
``ours-paged4`` is the same with 4-bit KV (``kv_cache: paged_int4``): half the bytes per frame,
so about twice the sessions in the same pool.
``--agreement-frames`` also reports greedy-token agreement of paged 8-bit and 4-bit KV against
bf16 rings (same inputs, fresh rows, free-running).

Memory is reported as if each side ran alone: its own weights plus the peak it allocated
for this batch (KV ring, activations, graph pool); the two sides share one copy of the
weights so that either can use the memory it would have alone. A configuration whose KV ring alone
would not fit in free memory is skipped (``"skipped": "oom"``); a real OOM is caught too.

CUDA: ``python benchmarks/moshi_tick.py`` (7B shape, bf16). CPU: a tiny shape, eager
only, so the script itself stays testable. Prints a table; JSON to
``benchmarks/results/moshi_tick.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from moshi_build import (
    build,
    module_bytes,
    prefill_ours,
    prefill_paged,
    prefill_reference,
    print_kernels,
    set_ours_ring,
    set_reference_ring,
    share_weights,
    sync,
    time_steps,
)

from rtserve.engines.moshi import fused
from rtserve.engines.moshi.frame_step import DEFAULT_SPAN_BUCKET, FrameStep
from rtserve.engines.moshi.lm import MoshiLM
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.paged_kv import PagedKVSpec
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler

RESULTS = Path(__file__).parent / "results" / "moshi_tick.json"
GIB = 2**30
# Headroom left free when deciding whether a configuration's KV ring fits (activations, graph pools).
FIT_MARGIN_BYTES = 3 * GIB
# Paged KV: frames per block, and the activation/graph memory left free per row beside the pool.
PAGED_BLOCK = 64
PAGED_MARGIN_PER_ROW = 48 * 2**20


def time_frames(
    step: Callable[[], None],
    prefill: Callable[[str], str | None],
    fills: list[str],
    frames: int,
    warmup: int,
    device: torch.device,
    profile: bool = False,
) -> dict[str, dict[str, Any]]:
    """p50/p99 ms per frame at each fill, after ``warmup`` untimed frames per fill (``prefill``
    returns why a fill cannot run, or None)."""
    out: dict[str, dict[str, Any]] = {}
    for fill in fills:
        skipped = prefill(fill)
        if skipped is not None:
            out[fill] = {"skipped": skipped}
            continue
        out[fill] = time_steps(step, frames, warmup, device, profile)
    return out


@contextmanager
def measured_memory(device: torch.device, result: dict[str, Any], weights: int) -> Iterator[None]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    try:
        yield
    finally:
        if device.type == "cuda":
            state = torch.cuda.max_memory_allocated(device) - before
            result["state_gib"] = state / GIB
            result["peak_gib"] = (state + weights) / GIB


def row_fills(fill: str, batch: int) -> npt.NDArray[np.int64]:
    """Per-row fills of a fill label: ``N`` (every row at N) or ``mixN`` (evenly over 0..2N)."""
    if fill.startswith("mix"):
        return np.linspace(0, 2 * int(fill[3:]), batch).round().astype(np.int64)
    return np.full(batch, int(fill), np.int64)


def paged_spec(lm: MoshiLM, batch: int, device: torch.device, bits: int) -> PagedKVSpec:
    """As many blocks as fit in free memory (minus the margin), and no more than ``batch`` full contexts."""
    t = lm.transformer
    spec = PagedKVSpec(num_blocks=1, block_size=PAGED_BLOCK, bits=bits)
    wanted = batch * spec.width(lm.config.context)
    if device.type != "cuda":
        return replace(spec, num_blocks=wanted)
    block_bytes = PagedKVSpec.bytes_per_frame(len(t.layers), t.heads, t.dim // t.heads, bits) * PAGED_BLOCK
    free, _ = torch.cuda.mem_get_info(device)
    margin = FIT_MARGIN_BYTES + batch * PAGED_MARGIN_PER_ROW
    return replace(spec, num_blocks=max(1, min(wanted, (free - margin) // block_bytes)))


@contextmanager
def glue_fused(enabled: bool) -> Iterator[None]:
    """``fused`` kernels on or off while inside (on after)."""
    fused.set_enabled(enabled)
    try:
        yield
    finally:
        fused.set_enabled(True)


@contextmanager
def paged_kv(lm: MoshiLM, spec: PagedKVSpec | None, context: int) -> Iterator[None]:
    """Paged KV with a ``context``-frame window while inside (bf16 rings as before after)."""
    if spec is None:
        yield
        return
    t = lm.transformer
    saved = (t.capacity, t.context)
    t.context = context
    t.use_paged_kv(spec)
    try:
        yield
    finally:
        t.use_paged_kv(None)
        t.capacity, t.context = saved


def run_ours(
    lm: MoshiLM, mimi: Mimi, batch: int, fills: list[str], args: argparse.Namespace, device: torch.device, side: str
) -> dict[str, Any]:
    """``side``: ours (graphed, context-sized attention), ours-fullring (graphed, always the whole
    ring, like the reference), ours-eager (no graphs), ours-paged8 (graphed, paged int8 KV),
    ours-paged4 (the same in 4 bits), ours-paged8-unfused (paged int8 with the elementwise glue
    left to eager kernels, ``fused``), ours-paged8-decoder-bf16 or ours-paged8-codec-bf16 (paged
    int8 with a copy of Mimi whose decoder, or encoder and decoder, run in bf16:
    docs/engines.md#mimi-in-bf16-for-moshi)."""
    result: dict[str, Any] = {}
    if side.endswith(("-decoder-bf16", "-codec-bf16")):
        mimi = copy.deepcopy(mimi)
        mimi.decoder_to(torch.bfloat16)
        if side.endswith("-codec-bf16"):
            mimi.encoder_to(torch.bfloat16)
    paged = side.startswith("ours-paged")
    spec = paged_spec(lm, batch, device, 4 if side.startswith("ours-paged4") else 8) if paged else None
    with (
        measured_memory(device, result, module_bytes(lm) + module_bytes(mimi)),
        paged_kv(lm, spec, lm.config.context),
        glue_fused(side != "ours-paged8-unfused"),
    ):
        bucket = lm.transformer.capacity if side == "ours-fullring" else DEFAULT_SPAN_BUCKET
        frame = FrameStep(
            lm,
            mimi,
            SlotSampler(batch, device, MoshiSampling()),
            batch,
            graph=side != "ours-eager" and device.type == "cuda",
            span_bucket=bucket,
        )
        pcm = torch.randn(batch, mimi.frame_size, device=device) * 0.1

        def step() -> None:
            frame(pcm).tokens.cpu()

        def prefill(fill: str) -> str | None:
            fills_now = row_fills(fill, batch)
            if paged:
                if not prefill_paged(lm, fills_now):
                    return "kv pool"
            elif fill.startswith("mix"):
                return "n/a"
            else:
                prefill_ours(lm, int(fill))
            frame.positions[:] = fills_now
            return None

        result["fills"] = time_frames(step, prefill, fills, args.frames, args.warmup, device, args.profile)
        result["spans"] = len(frame.spans)
        if spec is not None:
            result["kv_blocks"] = spec.num_blocks
            result["kv_block_frames"] = spec.block_size
    return result


def run_reference(
    ref_lm: Any, ref_mimi: Any, batch: int, fills: list[str], args: argparse.Namespace, device: torch.device, side: str
) -> dict[str, Any]:
    """``side``: reference (as shipped: its norms, RoPE and gating compiled by ``torch.compile``)
    or reference-nocompile (those left eager, as in this file's runs before session 26)."""
    from moshi.models.lm import LMGen
    from moshi.utils.compile import no_compile

    result: dict[str, Any] = {}
    with (
        measured_memory(device, result, module_bytes(ref_lm) + module_bytes(ref_mimi)),
        no_compile() if side == "reference-nocompile" else contextlib.nullcontext(),
    ):
        gen = LMGen(ref_lm, use_sampling=False)
        pcm = torch.randn(batch, 1, ref_mimi.frame_size, device=device) * 0.1

        def step() -> None:
            codes = ref_mimi.encode(pcm)
            out = gen.step(codes[:, :8])
            if out is not None:
                ref_mimi.decode(out[:, 1:9])
                out.cpu()

        def prefill(fill: str) -> str | None:
            if fill.startswith("mix"):
                return "n/a"  # a fixed ring costs the same whatever the rows' fills
            prefill_reference(ref_lm, int(fill))
            return None

        with gen.streaming(batch), ref_mimi.streaming(batch):
            result["fills"] = time_frames(step, prefill, fills, args.frames, args.warmup, device, args.profile)
    return result


def release(lm: MoshiLM, mimi: Mimi, device: torch.device) -> None:
    """Drop our streaming state (KV rings) so the other side gets the memory back."""
    lm.start(0)
    mimi.start(0)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fits(batch: int, ring: int, kv_bytes_per_frame: int, device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return batch * ring * kv_bytes_per_frame + FIT_MARGIN_BYTES < free


@torch.no_grad()
def graph_check(lm: MoshiLM, mimi: Mimi, frames: int, device: torch.device) -> dict[str, Any]:
    """The graphed step must give the eager step's tokens and audio on the same inputs (B=2, fresh
    rows); beside it, how far eager steps with the glue unfused drift from fused ones (rounding)."""
    gen = torch.Generator(device="cpu").manual_seed(3)
    inputs = [(torch.randn(2, mimi.frame_size, generator=gen) * 0.1).to(device) for _ in range(frames)]
    runs = []
    for graph, fuse in ((False, True), (True, True), (False, False)):
        with glue_fused(fuse):
            frame = FrameStep(lm, mimi, SlotSampler(2, device, MoshiSampling()), 2, graph=graph)
            outs = []
            for pcm in inputs:
                out = frame(pcm)  # a graphed step's outputs are static buffers: copy each frame's
                outs.append((out.tokens.cpu(), out.audio.float().cpu()))
        runs.append(outs)
        del frame
        release(lm, mimi, device)

    def compare(a_run: list[Any], b_run: list[Any]) -> tuple[int, float]:
        same = sum(torch.equal(a[0], b[0]) for a, b in zip(a_run, b_run))
        # NaN counts as the largest error (max() would skip it).
        err = max(
            float(((a[1] - b[1]).norm() / b[1].norm().clamp(min=1e-12)).nan_to_num(float("inf")))
            for a, b in zip(a_run, b_run)
        )
        return same, err

    silent = sum(not bool(out[1].abs().gt(0).any()) for out in runs[0])
    nonfinite = sum(not bool(out[1].isfinite().all()) for out in runs[0])
    same, err = compare(runs[0], runs[1])
    unfused_same, unfused_err = compare(runs[0], runs[2])
    return {
        "frames": frames,
        "silent_audio_frames": silent,
        "nonfinite_audio_frames": nonfinite,
        "identical_token_frames": same,
        "max_audio_rel_err": err,
        "unfused_identical_token_frames": unfused_same,
        "unfused_max_audio_rel_err": unfused_err,
    }


@torch.no_grad()
def greedy_agreement(lm: MoshiLM, mimi: Mimi, frames: int, batch: int, device: torch.device) -> dict[str, Any]:
    """Free-running greedy tokens with paged 8-bit and 4-bit KV against bf16 rings over ``frames`` frames
    (same user audio, fresh rows): share of identical token frames and each row's first
    divergence. The noise floor beside it: bf16 rings through another attention kernel (the
    math SDPA backend instead of the fused one), i.e. the same precision, other rounding."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cpu").manual_seed(5)
    inputs = [(torch.randn(batch, mimi.frame_size, generator=gen) * 0.1).to(device) for _ in range(frames)]
    width = PagedKVSpec(num_blocks=1, block_size=PAGED_BLOCK).width(lm.config.context)
    paged8 = PagedKVSpec(num_blocks=batch * width, block_size=PAGED_BLOCK)
    paged4 = replace(paged8, bits=4)
    runs = []
    for spec, backends in ((None, None), (paged8, None), (None, [SDPBackend.MATH]), (paged4, None)):
        with paged_kv(lm, spec, lm.config.context), sdpa_kernel(backends) if backends else contextlib.nullcontext():
            frame = FrameStep(lm, mimi, SlotSampler(batch, device, MoshiSampling()), batch, graph=device.type == "cuda")
            runs.append(torch.stack([frame(pcm).tokens.cpu() for pcm in inputs]))  # [frames, B, 1 + dep_q]
            del frame
            release(lm, mimi, device)

    def compare(other: torch.Tensor) -> dict[str, Any]:
        same = (runs[0] == other).all(-1)  # [frames, B]
        return {
            "identical_token_frames": float(same.float().mean()),
            "text_token_agreement": float((runs[0][..., 0] == other[..., 0]).float().mean()),
            "audio_token_agreement": float((runs[0][..., 1:] == other[..., 1:]).float().mean()),
            "first_divergence_per_row": [int(np.argmin(col)) if not col.all() else frames for col in same.T.numpy()],
        }

    return {
        "frames": frames,
        "batch": batch,
        "int8_paged_vs_bf16": compare(runs[1]),
        "bf16_math_sdpa_vs_bf16": compare(runs[2]),
        "int4_paged_vs_bf16": compare(runs[3]),
    }


@torch.no_grad()
def kernels_per_frame(lm: MoshiLM, mimi: Mimi, device: torch.device) -> int:
    """GPU kernels one eager frame launches (what a graph replays): the launch-count floor at small B.
    Run after the timings: the profiler's hooks can stay active and slow later launches."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    frame = FrameStep(lm, mimi, SlotSampler(2, device, MoshiSampling()), 2)
    pcm = torch.zeros(2, mimi.frame_size, device=device)
    frame(pcm)
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        frame(pcm)
        sync(device)
    del frame
    release(lm, mimi, device)
    return sum(1 for event in prof.events() if event.device_type == DeviceType.CUDA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("7b", "tiny"), default=None)
    parser.add_argument("--batches", default=None, help="comma list (default 1,16,64,80,128,160,256 on CUDA)")
    parser.add_argument("--rings", default=None, help="KV ring frames, comma list (default 3000,1500)")
    parser.add_argument(
        "--fills",
        default=None,
        help="context fill frames, comma list (default 0,1500,3000,mix1500);"
        " mixN: rows evenly over 0..2N (paged side only)",
    )
    parser.add_argument(
        "--sides",
        default="ours-paged8,ours,reference",
        help="ours-paged8, ours-paged4, ours-paged8-unfused, ours-paged8-decoder-bf16, ours-paged8-codec-bf16, ours, "
        "ours-fullring, ours-eager, reference,"
        " reference-nocompile",
    )
    parser.add_argument("--agreement-frames", type=int, default=200, help="paged KV vs bf16 greedy frames (0: skip)")
    parser.add_argument("--agreement-batch", type=int, default=4)
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--check-frames", type=int, default=20, help="graphed vs eager frames (0: skip)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--profile", action="store_true", help="also print each side's top kernels (torch.profiler)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shape = args.shape or ("7b" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    big = shape == "7b"
    batches = [int(b) for b in (args.batches or ("1,16,64,80,128,160,256" if cuda else "1,2")).split(",")]
    rings = [int(r) for r in (args.rings or ("3000,1500" if big else "100,50")).split(",")]
    fills = (args.fills or ("0,1500,3000,mix1500" if big else "0,50,100,mix50")).split(",")
    sides = args.sides.split(",")
    if not cuda:  # no graphs on CPU
        sides = list(dict.fromkeys("ours-eager" if s in ("ours", "ours-fullring") else s for s in sides))
    ref_lm, ref_mimi, lm, mimi, config = build(shape, device, dtype)
    share_weights(lm, ref_lm)
    gc.collect()
    kv_frame = config.num_layers * 2 * config.dim * torch.finfo(dtype).bits // 8
    check = graph_check(lm, mimi, args.check_frames, device) if cuda and args.check_frames else None
    agreement = (
        greedy_agreement(lm, mimi, args.agreement_frames, args.agreement_batch, device)
        if args.agreement_frames
        else None
    )
    if agreement is not None:
        print(json.dumps({"greedy_agreement": agreement}), flush=True)
    rows: list[dict[str, Any]] = []
    for ring in rings:
        set_ours_ring(lm, ring)
        set_reference_ring(ref_lm, ring)
        too_big: set[str] = set()
        for batch in batches:
            row: dict[str, Any] = {"ring": ring, "batch": batch}
            for side in sides:
                if side in too_big or (not side.startswith("ours-paged") and not fits(batch, ring, kv_frame, device)):
                    row[side] = {"skipped": "oom"}
                    too_big.add(side)
                    continue
                try:
                    if side.startswith("reference"):
                        row[side] = run_reference(ref_lm, ref_mimi, batch, fills, args, device, side)
                    else:
                        row[side] = run_ours(lm, mimi, batch, fills, args, device, side)
                except torch.OutOfMemoryError:
                    row[side] = {"skipped": "oom"}
                    too_big.add(side)
                release(lm, mimi, device)
            rows.append(row)
            for side in sides:
                for fill, timing in row[side].get("fills", {}).items():
                    if "kernels" in timing:
                        print_kernels(f"ring={ring} B={batch} fill={fill} {side}", timing.pop("kernels"))
            print(json.dumps(row), flush=True)
    if check is not None:
        check["kernels_per_frame"] = kernels_per_frame(lm, mimi, device)
        with glue_fused(False):
            check["kernels_per_frame_unfused"] = kernels_per_frame(lm, mimi, device)
    print_table(rows, sides, fills, shape, dtype, device)
    if agreement is not None:
        for name in ("int8_paged_vs_bf16", "int4_paged_vs_bf16", "bf16_math_sdpa_vs_bf16"):
            a = agreement[name]
            print(
                f"greedy {name}, {agreement['frames']} frames x B={agreement['batch']}: "
                f"{a['identical_token_frames']:.1%} identical token frames, text {a['text_token_agreement']:.1%}, "
                f"audio {a['audio_token_agreement']:.1%}; first divergence {a['first_divergence_per_row']}"
            )
    if check is not None:
        print(
            f"graphed vs eager over {check['frames']} frames: {check['identical_token_frames']} identical token "
            f"frames, max audio rel err {check['max_audio_rel_err']:.2e}; {check['kernels_per_frame']} kernels/frame "
            f"({check['kernels_per_frame_unfused']} unfused); eager unfused vs fused: "
            f"{check['unfused_identical_token_frames']} identical token frames, max audio rel err "
            f"{check['unfused_max_audio_rel_err']:.2e}; eager audio: {check['silent_audio_frames']} silent, "
            f"{check['nonfinite_audio_frames']} non-finite frames"
        )
    result = {
        "shape": shape,
        "dtype": str(dtype),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "frames": args.frames,
        "warmup": args.warmup,
        "kv_bytes_per_frame_per_session": kv_frame,
        "graph_check": check,
        "greedy_agreement": agreement,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))


def print_table(
    rows: list[dict[str, Any]], sides: list[str], fills: list[str], shape: str, dtype: torch.dtype, device: torch.device
) -> None:
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"moshi tick, shape={shape}, dtype={dtype}, device={name}; ms/frame p50/p99 (peak GiB as if alone)")
    header = f"{'ring':>5} {'B':>4} {'fill':>8}" + "".join(f" {side:>24}" for side in sides)
    print(header)
    for row in rows:
        for fill in fills:
            cells = []
            for side in sides:
                r = row.get(side, {})
                f = r.get("fills", {}).get(fill)
                if f is None or "skipped" in f:
                    cells.append(f" {(f or r).get('skipped', '-'):>24}")
                else:
                    mem = f" ({r['peak_gib']:.0f})" if "peak_gib" in r else ""
                    cells.append(f" {f['p50_ms']:>8.2f}/{f['p99_ms']:<8.2f}{mem:>7}")
            print(f"{row['ring']:>5} {row['batch']:>4} {fill:>8}" + "".join(cells))


if __name__ == "__main__":
    main()
