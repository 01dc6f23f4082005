"""A transformer whose rows move in step (the depformer) uses plans built once at ``start`` and
computes what the same transformer planning every call computes."""

from __future__ import annotations

import pytest
import torch

from rtserve.engines.moshi.layers import Transformer

BATCH, DIM, HEADS = 3, 32, 4


def _pair(context: int, steps: int) -> tuple[Transformer, Transformer]:
    """(planned every call, rows in step), same weights."""

    def make(shared_positions: int | None) -> Transformer:
        return Transformer(
            DIM,
            HEADS,
            2,
            64,
            norm="rms_norm",
            gating=True,
            layer_scale=False,
            num_weights=steps,
            rope_max_period=None,
            context=context,
            capacity=context,
            shared_positions=shared_positions,
        )

    torch.manual_seed(0)
    every_call = make(None)
    in_step = make(steps)
    in_step.load_state_dict(every_call.state_dict())
    for model in (every_call, in_step):
        model.eval()
        model.start(BATCH, torch.device("cpu"), torch.float32)
    return every_call, in_step


@pytest.mark.parametrize(("context", "steps"), [(8, 8), (4, 10)])  # the second wraps its ring
@torch.no_grad()
def test_rows_in_step_compute_what_planning_every_call_computes(context: int, steps: int) -> None:
    every_call, in_step = _pair(context, steps)
    gen = torch.Generator().manual_seed(1)
    for _frame in range(2):  # the second frame reads ring slots the first one wrote
        every_call.offset.zero_()
        in_step.restart()
        for step in range(steps):
            x = torch.randn(BATCH, 1, DIM, generator=gen)
            torch.testing.assert_close(in_step(x, step), every_call(x, step), rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_rows_in_step_refuse_a_step_past_their_count() -> None:
    _, in_step = _pair(8, 3)
    in_step.restart()
    for _ in range(3):
        in_step(torch.zeros(BATCH, 1, DIM))
    with pytest.raises(ValueError, match="at most 3"):
        in_step(torch.zeros(BATCH, 1, DIM))
