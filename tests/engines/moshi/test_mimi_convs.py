"""Mimi's streaming convolutions equal one whole-sequence convolution, on every path they take:
cuDNN / oneDNN for long inputs, one matmul for few steps, products for the channel-wise upsampler."""

from __future__ import annotations

from typing import TypeVar

import pytest
import torch
from torch.nn import functional as F

from rtserve.engines.moshi.mimi import MATMUL_STEPS, StreamConv1d, StreamConvTranspose1d

CPU = torch.device("cpu")
M = TypeVar("M", bound=torch.nn.Module)


def _randomized(module: M) -> M:
    for param in module.parameters():
        torch.nn.init.normal_(param)
    return module


@pytest.mark.parametrize("steps", [2, MATMUL_STEPS, MATMUL_STEPS + 3])
def test_a_streamed_strided_conv_equals_the_whole_sequence_conv(steps: int) -> None:
    torch.manual_seed(0)
    conv = _randomized(StreamConv1d(16, 24, kernel=16, stride=8))
    conv.start(3, CPU, torch.float32)
    chunks = [torch.randn(3, 16, 8 * steps) for _ in range(3)]
    outputs = [conv(chunk) for chunk in chunks]
    # cuDNN's layout on every path: the codec transformers' compiled glue specialises on strides.
    assert all(out.is_contiguous() for out in outputs)
    streamed = torch.cat(outputs, dim=-1)
    whole = F.conv1d(F.pad(torch.cat(chunks, dim=-1), (conv.context, 0)), conv.weight, conv.bias, stride=8)
    torch.testing.assert_close(streamed, whole, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("groups", "steps"), [(1, 2), (1, MATMUL_STEPS + 3), (16, 1), (16, MATMUL_STEPS + 3)])
def test_a_streamed_transposed_conv_equals_the_whole_sequence_one(groups: int, steps: int) -> None:
    torch.manual_seed(1)
    conv = _randomized(StreamConvTranspose1d(16, 16, kernel=16, stride=8, groups=groups))
    conv.start(3, CPU, torch.float32)
    chunks = [torch.randn(3, 16, steps) for _ in range(3)]
    outputs = [conv(chunk) for chunk in chunks]
    assert all(out.is_contiguous() for out in outputs)
    streamed = torch.cat(outputs, dim=-1)
    whole = F.conv_transpose1d(torch.cat(chunks, dim=-1), conv.weight, conv.bias, stride=8, groups=groups)
    # Streaming holds back the overlapping tail of the last call.
    torch.testing.assert_close(streamed, whole[..., : streamed.shape[-1]], rtol=1e-5, atol=1e-4)
