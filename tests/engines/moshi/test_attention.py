"""The explicit attention Mimi's fp32 transformers use on CUDA computes what SDPA computes."""

import torch
from torch.nn import functional as F

from rtserve.engines.moshi.layers import StepPlan, explicit_attention


def test_explicit_attention_matches_sdpa_under_a_ring_mask() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, heads, steps, head_dim, capacity = 3, 4, 2, 16, 10
    # Rows at different positions: a fresh one (most slots masked), one mid-ring, one wrapped.
    plan = StepPlan.build(torch.tensor([0, 5, 23]), steps, heads, head_dim, capacity, 8, None, None)
    q = torch.randn(batch, heads, steps, head_dim, generator=gen)
    keys = torch.randn(batch, heads, capacity, head_dim, generator=gen)
    values = torch.randn(batch, heads, capacity, head_dim, generator=gen)
    expected = F.scaled_dot_product_attention(q, keys, values, plan.mask)
    torch.testing.assert_close(explicit_attention(q, keys, values, plan.mask), expected, rtol=1e-5, atol=1e-6)
