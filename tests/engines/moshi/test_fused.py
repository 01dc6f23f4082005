"""The fused (compiled) glue kernels compute what the eager functions compute (CUDA only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from rtserve.engines.moshi import fused
from rtserve.engines.moshi.layers import rope_tables
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="fusion compiles for CUDA only")
CUDA = torch.device("cuda")


@pytest.fixture
def eager_and_fused() -> Iterator[Callable[[Callable[[], object]], tuple[object, object]]]:
    def run(call: Callable[[], object]) -> tuple[object, object]:
        fused.set_enabled(False)
        try:
            eager = call()
        finally:
            fused.set_enabled(True)
        return eager, call()

    yield run
    fused.set_enabled(True)


@pytest.mark.parametrize("batch", [1, 5, 64])  # a second and a third shape: the recompiled, symbolic kernels
def test_norm_rope_and_gate_match_the_eager_math(eager_and_fused, batch: int) -> None:
    gen = torch.Generator(device=CUDA).manual_seed(batch)
    x = torch.randn(batch, 1, 256, device=CUDA, generator=gen).to(torch.bfloat16) * 3
    alpha = torch.rand(1, 1, 256, device=CUDA, generator=gen).to(torch.bfloat16)
    eager, compiled = eager_and_fused(lambda: fused.rms_norm(x, alpha, 1e-8))
    torch.testing.assert_close(compiled, eager, rtol=1.6e-2, atol=1e-2)

    qkv = torch.randn(batch, 1, 3, 4, 64, device=CUDA, generator=gen).to(torch.bfloat16).permute(2, 0, 3, 1, 4)
    cos, sin = rope_tables(torch.arange(batch, device=CUDA) * 37, 1, 64, 10000.0)
    eager, compiled = eager_and_fused(lambda: fused.apply_rope(qkv[0], qkv[1:], cos, sin))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)

    h = torch.randn(batch, 1, 2, 512, device=CUDA, generator=gen).to(torch.bfloat16)
    eager, compiled = eager_and_fused(lambda: fused.silu_gate(h))
    torch.testing.assert_close(compiled, eager, rtol=1.6e-2, atol=1e-2)

    scale = torch.full((256,), 0.01, device=CUDA)
    eager, compiled = eager_and_fused(lambda: fused.scaled_residual(x, x.float(), scale))
    torch.testing.assert_close(compiled, eager)

    update = torch.randn(batch, 1, 256, device=CUDA, generator=gen).to(torch.bfloat16)
    for factor in (scale.to(torch.bfloat16), None):  # layer-scaled and plain residuals
        eager, compiled = eager_and_fused(lambda f=factor: fused.residual_rms_norm(x, update, f, alpha, 1e-5))
        for got, want in zip(compiled, eager):
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


def test_fused_sampling_draws_the_same_tokens_as_eager(eager_and_fused) -> None:
    """The counter hash is integer math: compiled, it must give the same draws bit for bit."""
    gen = torch.Generator(device=CUDA).manual_seed(7)
    logits = torch.randn(6, 2048, device=CUDA, generator=gen) * 4

    def draw() -> torch.Tensor:
        sampler = SlotSampler(6, CUDA, MoshiSampling(use_sampling=True))
        for slot in range(3):  # rows 3..5 greedy
            sampler.configure(slot, None, seed=slot)
        for slot in range(3, 6):
            sampler.configure(slot, MoshiSampling(use_sampling=False), seed=slot)
        return torch.stack([sampler.sample(logits, text=False) for _ in range(20)])

    eager, compiled = eager_and_fused(draw)
    assert torch.equal(compiled, eager)
    assert len(set(eager[:, 0].tolist())) > 1  # sampling rows really sample
    assert (eager[:, 3:] == logits[3:].argmax(-1)).all()
