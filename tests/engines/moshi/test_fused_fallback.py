"""A fused function never fails on Dynamo's compile count: past it, the variant runs eager
(rtserve/engines/moshi/fused.py). Checked on the CPU by standing in for the compiler."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.exc import FailOnRecompileLimitHit

from rtserve.engines.moshi import fused


def _compiler_past_its_limit(fn: Callable[..., torch.Tensor], **_: object) -> Callable[..., torch.Tensor]:
    def compiled(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:  # the variants it has room for compile; this one is past the limit
            raise FailOnRecompileLimitHit("recompile_limit reached with fullgraph=True")
        return fn(x) * 0  # marks the compiled path

    return compiled


def test_a_variant_past_the_compile_limit_runs_eager_and_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fused, "_compiles", lambda first: True)
    monkeypatch.setattr(torch, "compile", _compiler_past_its_limit)

    @fused.fused
    def plus_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    with caplog.at_level(logging.WARNING, logger=fused.__name__):
        assert torch.equal(plus_one(torch.ones(2)), torch.zeros(2))  # compiled
        assert torch.equal(plus_one(torch.ones(3)), torch.full((3,), 2.0))  # eager, no exception
        assert torch.equal(plus_one(torch.ones(4)), torch.full((4,), 2.0))
    warnings = [r for r in caplog.records if "plus_one" in r.getMessage()]
    assert len(warnings) == 1
    assert torch._dynamo.config.recompile_limit >= fused.RECOMPILE_LIMIT
