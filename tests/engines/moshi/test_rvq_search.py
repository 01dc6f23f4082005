"""The Triton residual-VQ search picks the codes of the matmul path: compiled on CUDA, in Triton's
interpreter on CPU (``triton_support``)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from torch.nn import functional as F

from rtserve.engines.moshi.mimi import _RVQ
from tests.engines.moshi.triton_support import kernel_module


@pytest.fixture
def search() -> tuple[ModuleType, torch.device]:
    return kernel_module("rtserve.engines.moshi.rvq_search")


def _nearest_by_cdist(residual: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
    """Each codebook in turn, the nearest entry in float64: what either path must pick."""
    picked = []
    for codebook in codebooks:
        index = torch.cdist(residual[None].double(), codebook[None].double())[0].argmin(-1)
        residual = residual - F.embedding(index, codebook)
        picked.append(index)
    return torch.stack(picked, dim=1)


@pytest.mark.parametrize(("rows", "bins"), [(37, 300), (3, 64), (16, 2048)])
def test_the_kernels_pick_the_nearest_entry_of_every_codebook_in_turn(
    search: tuple[ModuleType, torch.device], rows: int, bins: int
) -> None:
    module, device = search
    gen = torch.Generator().manual_seed(0)
    codebooks = torch.randn(4, bins, 32, generator=gen)
    residual = torch.randn(rows, 32, generator=gen) * 2
    # A tie within and across the kernels' steps and chunks of entries: the lowest entry wins,
    # as argmin's first. Small integers, so every dot product is exact whatever order a BLAS (the
    # interpreter's tl.dot) sums in: with random floats, identical entries in other columns of a
    # tile came out a rounding apart on one CPU and the tie was no tie.
    codebooks[0, 9] = torch.randint(-4, 5, (32,), generator=gen).float()
    codebooks[0, bins // 3] = codebooks[0, bins - 1] = codebooks[0, 9]
    residual[0] = codebooks[0, bins - 1]
    want = _nearest_by_cdist(residual.clone(), codebooks)
    flat = residual.clone().to(device)
    got = module.nearest_codes(flat, codebooks.to(device), (codebooks * codebooks).sum(-1).to(device)).cpu()
    assert torch.equal(got, want)
    assert got[0, 0] == 9
    # The residual left is what the last codebook's entries leave.
    left = residual - sum(F.embedding(want[:, i], codebooks[i]) for i in range(4))
    torch.testing.assert_close(flat.cpu(), left, rtol=0, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_codec_quantizer_codes_each_step_of_each_row(device: str) -> None:
    """The matmul path on CPU, the kernels on CUDA: both give the nearest entries, step by step."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(1)
    rvq = _RVQ(dim=64, codebook_dim=16, layers=3, bins=128)
    torch.nn.init.normal_(rvq.input_proj.weight, std=0.2)
    rvq.codebooks.normal_()
    x = torch.randn(5, 64, 2)
    with torch.no_grad():
        flat = rvq.input_proj(x).transpose(1, 2).reshape(-1, 16)
        want = _nearest_by_cdist(flat, rvq.codebooks).view(5, 2, 3).transpose(1, 2)
        got = rvq.to(device).encode(x.to(device)).cpu()
    assert torch.equal(got, want)
