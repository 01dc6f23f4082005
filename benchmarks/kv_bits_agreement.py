"""What fewer KV bits cost in agreement (issue 35: "what a 4-bit KV would reach, with the
agreement it costs, measured on the tiny checkpoint against bf16").

The paged KV stores each (frame, head) key and value vector as symmetric integers with one fp32
scale (``paged_kv.quantize``: ``amax / (2**(bits-1) - 1)``), in 8 bits (``kv_cache: paged_int8``)
or packed 4 (``paged_int4``). This script runs both stores' CPU path and reports, per setting,
how soon free-running greedy decoding of the tests' tiny Moshi checkpoint (200 frames x 2 rows
per seed) first differs from fp32 rings, beside bf16 weights and rings (the precision the GPU
engine runs at); and the relative error of one attention layer's output against fp32 rings on
random activations (3 rows, 90 steps, past the window twice).

    .venv/bin/python benchmarks/kv_bits_agreement.py --seeds 5

JSON to ``benchmarks/results/kv_bits_agreement.json`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

sys.path.append(str(Path(__file__).resolve().parent.parent))  # appended: PYTHONPATH first

from rtserve.engines.moshi.frame_step import FrameStep
from rtserve.engines.moshi.layers import Transformer
from rtserve.engines.moshi.loader import LoadedModel, load_folder
from rtserve.engines.moshi.paged_kv import PagedKVSpec
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from tests.engines.moshi.tiny import write_checkpoint

RESULTS = Path(__file__).parent / "results" / "kv_bits_agreement.json"
CPU = torch.device("cpu")
FRAMES = 200
ROWS = 2


def greedy_tokens(model: LoadedModel, spec: PagedKVSpec | None, inputs: torch.Tensor) -> npt.NDArray[np.int64]:
    transformer = model.lm.transformer
    transformer.use_paged_kv(spec)
    try:
        frame = FrameStep(model.lm, model.mimi, SlotSampler(ROWS, CPU, MoshiSampling()), ROWS)
        return np.stack([frame(pcm).tokens.numpy().copy() for pcm in inputs])
    finally:
        transformer.use_paged_kv(None)


def attention_error(spec: PagedKVSpec | None, dtype: torch.dtype = torch.float32) -> float:
    """Median relative error of a 2-layer transformer's output (``spec``: paged KV, None: rings in
    ``dtype``) against fp32 rings over 90 steps."""

    def build(paged: PagedKVSpec | None, dtype: torch.dtype) -> Transformer:
        torch.manual_seed(0)
        t = Transformer(
            64, 4, 2, 256, norm="rms_norm_f32", gating=True, layer_scale=False,
            rope_max_period=10000, context=40, capacity=40,
        )  # fmt: skip
        if paged is not None:
            t.use_paged_kv(paged)
        t.to(dtype).start(3, CPU, dtype)
        return t

    ring, other = build(None, torch.float32), build(spec, dtype)
    positions = np.zeros(3, np.int64)
    errors = []
    gen = torch.Generator().manual_seed(1)
    for _ in range(90):
        x = torch.randn(3, 1, 64, generator=gen)
        if other.blocks is not None:
            other.blocks.ensure(np.arange(3), positions)
            other.blocks.sync()
        a, b = ring(x), other(x.to(dtype)).float()
        positions += 1
        errors.append(float((a - b).norm() / a.norm()))
    return float(np.median(errors))


def first_divergence(reference: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64]) -> list[int]:
    """Per row, the first frame whose tokens differ from the reference's (``FRAMES``: none)."""
    same = (reference == tokens).all(-1)  # [frames, rows]
    return [int(np.argmin(column)) if not column.all() else FRAMES for column in same.T]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, nargs="+", choices=[8, 4], default=[8, 4])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    settings: list[tuple[str, PagedKVSpec | None]] = [("bf16 rings", None)] + [
        (f"{b}-bit paged", PagedKVSpec(num_blocks=20, block_size=8, bits=b)) for b in args.bits
    ]
    diverged: dict[str, list[int]] = {name: [] for name, _ in settings}
    with tempfile.TemporaryDirectory() as folder:
        tiny = write_checkpoint(Path(folder) / "weights")
        fp32_model = load_folder(tiny.folder, device=CPU, dtype=torch.float32)
        bf16_model = load_folder(tiny.folder, device=CPU, dtype=torch.bfloat16)
        for seed in range(args.seeds):
            gen = torch.Generator().manual_seed(seed)
            inputs = 0.3 * torch.randn(FRAMES, ROWS, fp32_model.mimi.frame_size, generator=gen)
            fp32 = greedy_tokens(fp32_model, None, inputs)
            for name, spec in settings:
                tokens = greedy_tokens(bf16_model if spec is None else fp32_model, spec, inputs)
                diverged[name] += first_divergence(fp32, tokens)
    rows: list[dict[str, Any]] = []
    for name, spec in settings:
        error = attention_error(None, torch.bfloat16) if spec is None else attention_error(spec)
        rows.append({"setting": name, "first_divergence": diverged[name], "attention_error": error})
    print(f"{'setting':<13} {'attention rel. error':>20} {'frames to first token divergence: median (each row)'}")
    for row in rows:
        each = " ".join(str(f) for f in row["first_divergence"])
        print(
            f"{row['setting']:<13} {row['attention_error']:>20.5f} {np.median(row['first_divergence']):>6.0f}  ({each})"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
