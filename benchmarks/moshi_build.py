"""Shared set-up for the Moshi engine benchmarks: the reference ``moshi`` modules and ours
built on the same random weights, and direct access to both sides' temporal KV state.

Both sides get the same random weights (no download): the reference modules are built
with random init, and ours load their state dicts through the same Kyutai-name mapping
the folder loader uses. Needs ``moshi==0.2.13`` (installed ``--no-deps``) and ``einops``.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rtserve.engines.moshi.checkpoint import lm_rename, load_into, mimi_rename
from rtserve.engines.moshi.lm import MoshiLM
from rtserve.engines.moshi.lm_config import LMConfig, MimiConfig
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.paged_kv import PagedKVCache

TINY_LM = {
    "dim": 64,
    "text_card": 128,
    "n_q": 16,
    "dep_q": 8,
    "card": 64,
    "num_heads": 4,
    "num_layers": 2,
    "context": 100,
    "depformer_dim": 32,
    "depformer_dim_feedforward": 132,
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
}


def lm_kwargs(shape: str) -> dict[str, Any]:
    from moshi.models.loaders import _lm_kwargs

    kwargs = dict(_lm_kwargs)
    if shape == "tiny":
        kwargs.update(TINY_LM)
    return kwargs


def mimi_config(shape: str, card: int) -> dict[str, Any]:
    from moshi.models.loaders import _mimi_config

    cfg: dict[str, Any] = copy.deepcopy(_mimi_config)
    cfg["quantizer"]["bins"] = card
    if shape == "tiny":
        cfg["seanet"].update(dimension=32, n_filters=4)
        cfg["quantizer"].update(dimension=16, input_dimension=32, output_dimension=32, n_q=8)
        cfg["transformer"].update(
            d_model=32, num_heads=2, num_layers=1, dim_feedforward=64, input_dimension=32, output_dimensions=[32]
        )
    return cfg


def build(shape: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, MoshiLM, Mimi, LMConfig]:
    kwargs = lm_kwargs(shape)
    ref_lm, ours, config = build_lm(kwargs, device, dtype)
    ref_mimi, mimi = build_mimi(mimi_config(shape, kwargs["card"]), 8, device)
    return ref_lm, ref_mimi, ours, mimi, config


def random_reference_lm(kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """The reference ``LMModel`` of ``kwargs``, every weight random (seeded), built where it will run."""
    from moshi.models.lm import LMModel

    torch.manual_seed(0)
    ref_lm = LMModel(device=device, dtype=dtype, **kwargs).eval()
    with torch.no_grad():  # the reference init leaves some weights at defaults; randomise everything
        for param in ref_lm.parameters():
            param.normal_(0, 1.0 / max(param.shape[-1], 1) ** 0.5)
    return ref_lm


def build_lm(kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype) -> tuple[Any, MoshiLM, LMConfig]:
    """The reference ``LMModel`` of ``kwargs`` with random weights, and ours loaded from it."""
    ref_lm = random_reference_lm(kwargs, device, dtype)
    config = LMConfig.from_dict(kwargs)
    with torch.device("meta"):
        ours = MoshiLM(config)
    ours.to_empty(device=device)
    load_into(ours, ref_lm.state_dict(), Path("reference-lm"), lm_rename, dtype=dtype)
    return ref_lm.eval(), ours.eval(), config


def build_mimi(mcfg: dict[str, Any], codebooks: int, device: torch.device) -> tuple[Any, Mimi]:
    """The reference Mimi of ``mcfg`` (random weights, ``codebooks`` codebooks) and ours loaded from it."""
    from moshi.models.loaders import get_mimi

    ref_mimi = get_mimi(None, copy.deepcopy(mcfg), device=device, num_codebooks=codebooks)
    mimi = Mimi(MimiConfig.from_dict(mcfg), codebooks).to(device)
    state = ref_mimi.state_dict()
    load_into(mimi, state, Path("reference-mimi"), mimi_rename, dtype=torch.float32)
    with torch.no_grad():
        for part, n in (("rvq_first", 1), ("rvq_rest", codebooks - 1)):
            for i in range(n):
                p = f"quantizer.{part}.vq.layers.{i}._codebook."
                getattr(mimi.quantizer, part).codebooks[i] = (
                    state[p + "embedding_sum"] / state[p + "cluster_usage"].clamp(min=1e-5)[:, None]
                )
    return ref_mimi.eval(), mimi.eval()


def share_weights(lm: MoshiLM, ref_lm: Any) -> None:
    """Point our parameters at the reference's (equal after ``build``) so one copy of the 7B
    weights serves both sides: the GPU memory goes to KV rings, as it would for either alone."""
    ours = dict(lm.named_parameters())
    for name, param in ref_lm.named_parameters():
        mine = ours.get(lm_rename(name) or "")
        if mine is not None and mine.shape == param.shape and mine.dtype == param.dtype:
            mine.data = param.data


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def set_ours_ring(lm: MoshiLM, ring: int) -> None:
    """Temporal KV ring of ``ring`` frames (attention window too, as the reference does); takes effect at ``start``."""
    lm.transformer.capacity = ring
    lm.transformer.context = ring


def set_reference_ring(ref_lm: Any, ring: int) -> None:
    """The reference's ring is its attention ``context``; takes effect when streaming starts."""
    for layer in ref_lm.transformer.layers:
        layer.self_attn.context = ring


def prefill_ours(lm: MoshiLM, fill: int) -> None:
    """Every row as if ``fill`` frames had been stepped: positions advanced, ring filled with random K/V."""
    lm.transformer.offset.fill_(fill)
    for cache in lm.transformer.caches:
        cache.keys.normal_()
        cache.values.normal_()


def prefill_paged(lm: MoshiLM, fills: npt.NDArray[np.int64]) -> bool:
    """Paged KV: row ``r`` as if ``fills[r]`` frames had been stepped, holding the blocks those frames
    (and the next write) need, filled with random int8 K/V; False when the pool has too few blocks."""
    transformer = lm.transformer
    blocks = transformer.blocks
    assert blocks is not None and transformer.floor is not None
    size = blocks.spec.block_size
    for row in range(len(fills)):
        blocks.release(row)
    needed = [min(blocks.width, int(fill) // size + 1) for fill in fills]
    if sum(needed) > blocks.free_blocks:
        return False
    for row, count in enumerate(needed):
        for entry in range(count):
            blocks.table[row, entry] = blocks.free.pop()
    blocks.sync()
    transformer.offset.copy_(torch.from_numpy(np.asarray(fills, np.int64)))
    for cache in transformer.caches:
        assert isinstance(cache, PagedKVCache)  # blocks is set: every cache is paged
        for pool in (cache.keys, cache.values):
            pool.random_(-127, 128)
        for scales in (cache.key_scales, cache.value_scales):
            scales.fill_(3.0 / 127)  # what N(0, 1) entries quantize to
    return True


def prefill_reference(ref_lm: Any, fill: int) -> None:
    """The same for the reference's temporal transformer (its ring caches and both offset counters)."""
    ref_lm.transformer._streaming_state.offsets.fill_(fill)
    for layer in ref_lm.transformer.layers:
        state = layer.self_attn._streaming_state
        state.offset.fill_(fill)
        state.offset_cpu = fill
        state.kv_cache.cache.normal_()
        state.kv_cache.end_offset.fill_(fill)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` (0..1) quantile by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(times: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(times), "p99_ms": percentile(times, 0.99)}


def time_steps(
    step: Callable[[], object], frames: int, warmup: int, device: torch.device, profile: bool = False
) -> dict[str, Any]:
    """p50 / p99 ms of ``step`` over ``frames`` calls after ``warmup``, each bracketed by device syncs;
    with ``profile``, also where the time went (``kernel_profile`` over as many more calls)."""
    times = []
    for i in range(warmup + frames):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        if i >= warmup:
            times.append(1000 * (time.perf_counter() - start))
    result: dict[str, Any] = dict(summary(times))
    if profile:
        result["kernels"] = kernel_profile(step, frames, device)
    return result


def merge_rounds(rounds: list[dict[str, Any]], reference: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One side's results over alternating rounds (each side run once per round, in turn, so a
    host that speeds up or slows down touches both): the median p50 and p99, every round's p50,
    and with ``reference`` (the same rounds of the reference side) the median of the per-round
    ratios, which a slow round of either side moves less than the ratio of medians."""
    timed = [r for r in rounds if "p50_ms" in r]
    if not timed:
        return rounds[-1]
    merged: dict[str, Any] = {
        "p50_ms": statistics.median(r["p50_ms"] for r in timed),
        "p99_ms": statistics.median(r["p99_ms"] for r in timed),
        "rounds_p50_ms": [r["p50_ms"] for r in timed],
    }
    if reference is not None:
        ratios = [r["p50_ms"] / ref["p50_ms"] for r, ref in zip(rounds, reference) if "p50_ms" in r and "p50_ms" in ref]
        if ratios:
            merged["ratio_median"] = statistics.median(ratios)
    if "kernels" in rounds[-1]:
        merged["kernels"] = rounds[-1]["kernels"]
    return merged


def kernel_profile(
    step: Callable[[], object], frames: int, device: torch.device, top: int = 40
) -> list[dict[str, Any]]:
    """Self time per operator over ``frames`` calls of ``step`` (``torch.profiler``): on a GPU the
    kernels, including those replayed from CUDA graphs; on a CPU the aten operators. The ``top``
    by total, as microseconds and calls per frame, plus a ``total`` row."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    sync(device)
    with profile(activities=[activity]) as prof:
        for _ in range(frames):
            step()
        sync(device)
    rows = []
    for event in prof.key_averages():
        self_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if self_us > 0:
            rows.append({"name": event.key[:90], "us": self_us / frames, "calls": event.count / frames})
    rows.sort(key=lambda r: -r["us"])
    total = {"name": "total", "us": sum(r["us"] for r in rows), "calls": sum(r["calls"] for r in rows)}
    return [total, *rows[:top]]


def print_kernels(label: str, kernels: list[dict[str, Any]]) -> None:
    print(f"-- {label}: self time per frame (us), calls per frame")
    for row in kernels:
        print(f"{row['us']:>10.1f} {row['calls']:>7.1f}  {row['name']}")
