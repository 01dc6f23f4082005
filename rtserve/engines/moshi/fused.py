"""The elementwise glue around the matrix products, one kernel per function on CUDA.

In eager PyTorch an fp32 RMSNorm is ~8 kernels, interleaved RoPE on queries and keys ~20,
the gated SiLU 2 and a sampling draw ~25 (the counter hash, the race). At the 7B shape that
is thousands of tiny kernels per frame, and even replayed from a CUDA graph each costs a
launch and a round trip of its operands through memory (benchmarks/notes/moshi_speed.md, "v5"). Inductor
(``torch.compile``) turns each function decorated with ``fused`` (those below, the summed token
embeddings in ``lm.py``, the sampling draw in ``sampling.py``) into one or a few Triton kernels
with the same math and the same fp32 accumulation; only the order of the terms of a reduction
may differ, in the last bit.

CPU keeps the eager functions: the fp32 parity gates and the tests run there, and compiling
for the CPU would cost minutes per shape. ``set_enabled(False)`` turns fusion off (the
``moshi_engine.fuse_glue`` setting, the benchmarks' A/B); it takes effect for kernels run or
graphs captured after the call. The first call of each shape compiles (seconds): ``FrameStep``
runs one eager step per graph before capture, so compilation never happens inside one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
from torch.nn import functional as F

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")
_enabled = True
# Variants Dynamo compiles of one function before it stops. An engine process compiles each of
# these for every model it serves (dtypes, widths, norm epsilons, with and without a layer scale,
# batch buckets); the default 8 was reached by the CUDA tests' many models in one process, and
# with fullgraph=True reaching it raises rather than running eager.
RECOMPILE_LIMIT = 64


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def _compiles(first: object) -> bool:
    return _enabled and isinstance(first, torch.Tensor) and first.is_cuda


def _compile(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    # Imported here, on the first CUDA call: Dynamo loads Triton, which the CPU test runs switch
    # to its interpreter first.
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    # dynamic=None: the first shape is specialised, a second one makes the changing dimensions
    # symbolic, so a handful of batch buckets costs two compiles, not one each.
    return torch.compile(fn, fullgraph=True)


def _past_recompile_limit(exc: Exception) -> bool:
    from torch._dynamo.exc import FailOnRecompileLimitHit

    return isinstance(exc, FailOnRecompileLimitHit)


def fused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` (a pure function of tensors, first argument on the device that decides) compiled
    once on first use with a CUDA tensor while fusion is enabled; eager otherwise, and eager for a
    variant past ``RECOMPILE_LIMIT`` (logged once), so a process serving many models never fails
    on a compile count."""
    compiled: Callable[_P, _R] | None = None
    warned = False

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        nonlocal compiled, warned
        if not _compiles(args[0]):
            return fn(*args, **kwargs)
        if compiled is None:
            compiled = _compile(fn)
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:
            if not _past_recompile_limit(exc):
                raise
            if not warned:
                warned = True
                log.warning("%s: past %d compiled variants, new ones run eager", fn.__name__, RECOMPILE_LIMIT)
            return fn(*args, **kwargs)

    return call


def _rms_norm(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with its statistics in fp32 (``rms_norm_f32``), back in ``x``'s dtype."""
    x32 = x.float()
    var = eps + torch.mean(x32**2, dim=-1, keepdim=True)
    return (x32 * (alpha.to(var) * torch.rsqrt(var))).to(x.dtype)


rms_norm = fused(_rms_norm)


@fused
def apply_rope(
    q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``[B, H, T, D]`` queries and the keys of ``kv`` (``[2, B, H, T, D]``: keys, values) by
    tables from ``layers.rope_tables`` (in fp32); the values come back beside the rotated keys, in
    one tensor, so the ring takes both in one write."""
    dim = q.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = x.view(*x.shape[:-1], dim // 2, 2)
        re, im = pairs[..., 0].float(), pairs[..., 1].float()
        out_re, out_im = re * cos - im * sin, re * sin + im * cos
        return torch.stack([out_re.to(x.dtype), out_im.to(x.dtype)], dim=-1).view(*x.shape[:-1], dim)

    return rotate(q), torch.stack((rotate(kv[0]), kv[1]))


@fused
def silu_gate(h: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for ``h`` = ``[..., 2, hidden]`` holding ``a`` then ``b``."""
    return F.silu(h[..., 0, :]) * h[..., 1, :]


def _residual(x: torch.Tensor, update: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x + scale * update`` in ``update``'s dtype (a residual branch, layer-scaled unless ``scale`` is None)."""
    return x.to(update) + (update if scale is None else scale * update)


scaled_residual = fused(_residual)


@fused
def residual_rms_norm(
    x: torch.Tensor, update: torch.Tensor, scale: torch.Tensor | None, alpha: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual branch and the RMSNorm of its sum, which the next block reads: one kernel on
    CUDA instead of two, twice a layer."""
    summed = _residual(x, update, scale)
    return summed, _rms_norm(summed, alpha, eps)
