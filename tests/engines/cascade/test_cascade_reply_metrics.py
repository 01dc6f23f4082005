"""A voice reply's LLM metrics (``rtserve_cascade_turn_seconds{stage="llm_first_token"}`` and
``rtserve_cascade_llm_tokens_per_second``) from both kinds of token stream: an embedded engine's,
whose every delta carries the running token count, and a vLLM's, whose deltas carry none until
the last one brings the total (docs/engines.md#cascade-turn-metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import pytest
from prometheus_client import CollectorRegistry

from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.reply import ReplyChain
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta

FIRST_S = 0.05  # to the first token
TOKEN_S = 0.1  # a token after it (wide apart: a loaded machine's stalls stay far below the whole reply)
TOKENS = 11
ROUTE = "/v1/realtime"


class PacedLLM:
    """Ten words after ``FIRST_S``, one every ``TOKEN_S``; ``counted``: each delta carries the running
    count (an embedded engine) or none until the last (a vLLM's usage chunk)."""

    model_name = "paced"

    def __init__(self, counted: bool) -> None:
        self.counted = counted

    async def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        await asyncio.sleep(FIRST_S)
        for n in range(1, TOKENS + 1):
            if n > 1:
                await asyncio.sleep(TOKEN_S)
            yield TokenDelta(" word", completion_tokens=n if self.counted else 0)
        yield TokenDelta("", finish_reason="stop", prompt_tokens=8, completion_tokens=TOKENS)


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


@pytest.mark.parametrize("counted", [True, False], ids=["embedded", "vllm"])
async def test_first_token_and_rate_are_the_llms_not_the_whole_replys(counted: bool) -> None:
    registry = CollectorRegistry()
    chain = ReplyChain(
        PacedLLM(counted),
        None,
        registry,
        CascadeMetrics(registry),
        chunk_samples=480,
        first_piece_max_chars=120,
        first_clause_min_chars=0,
    )
    async for _ in chain.run([ChatMessage("user", "hi")], SamplingParams(), speak=False, route=ROUTE):
        pass

    first = {"route": ROUTE, "stage": "llm_first_token"}
    assert _sample(registry, "rtserve_cascade_turn_seconds_count", **first) == 1
    first_s = _sample(registry, "rtserve_cascade_turn_seconds_sum", **first)
    whole_s = FIRST_S + (TOKENS - 1) * TOKEN_S
    assert FIRST_S * 0.8 <= first_s < whole_s / 2  # the first token's time, not the whole reply's
    assert _sample(registry, "rtserve_cascade_llm_tokens_per_second_count", route=ROUTE) == 1
    rate = _sample(registry, "rtserve_cascade_llm_tokens_per_second_sum", route=ROUTE)
    assert 0 < rate <= 1 / TOKEN_S * 1.2  # at most the paced rate (a loaded machine only slows it)
