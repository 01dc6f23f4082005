"""The CTranslate2 LLM steps aside for other turns' first audio: a reply past its first piece
pauses while a final transcript or a first spoken piece is pending, within its budget."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade.first_audio import FirstAudioWork
from rtserve.engines.cascade.llm_ct2 import Ct2Llm
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.values import ChatMessage, SamplingParams

pytestmark = pytest.mark.models

STORY = (ChatMessage("user", "Tell me a long story about a dragon who learns to bake bread."),)
FIRST_PIECE_TOKENS = 4
BUDGET_S = 2.0
PAUSED = "rtserve_cascade_llm_stepped_aside_seconds_total"


class SteppingLlm:
    def __init__(self, llm: Ct2Llm, first_audio: FirstAudioWork, registry: CollectorRegistry) -> None:
        self.llm, self.first_audio, self.registry = llm, first_audio, registry

    def paused_s(self) -> float:
        return self.registry.get_sample_value(PAUSED) or 0.0

    async def reply(self, max_tokens: int) -> list[tuple[float, int, str]]:
        """(arrival time, completion tokens, text) of each delta of a greedy reply."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        return [(time.monotonic(), d.completion_tokens, d.text) async for d in self.llm.generate(STORY, params)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stepping() -> AsyncIterator[SteppingLlm]:
    overrides = {"llm_first_piece_tokens": FIRST_PIECE_TOKENS, "llm_step_aside_ms": BUDGET_S * 1000}
    config = load_config(environ={}, overrides={"cascade": overrides})
    registry, first_audio = CollectorRegistry(), FirstAudioWork()
    llm = create_llm(config, CascadeMetrics(registry), first_audio)
    assert isinstance(llm, Ct2Llm)
    await llm.start()
    yield SteppingLlm(llm, first_audio, registry)
    llm.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_reply_past_its_first_piece_waits_until_the_first_audio_work_ends(stepping: SteppingLlm) -> None:
    alone = await stepping.reply(12)
    before = stepping.paused_s()
    stepping.first_audio.begin()  # another turn's first piece waits for the TTS
    released_at: list[float] = []

    def release() -> None:
        released_at.append(time.monotonic())
        stepping.first_audio.end()

    asyncio.get_running_loop().call_later(1.0, release)  # the first piece needs ~0.1 s alone
    held = await stepping.reply(12)
    assert "".join(text for _, _, text in held) == "".join(text for _, _, text in alone)  # same reply
    # Its first piece came at once; the rest only after the other turn's work ended.
    assert any(tokens <= FIRST_PIECE_TOKENS and at < released_at[0] for at, tokens, _ in held)
    assert all(at >= released_at[0] for at, tokens, _ in held if tokens > FIRST_PIECE_TOKENS)
    assert 0.2 < stepping.paused_s() - before < BUDGET_S


@pytest.mark.asyncio(loop_scope="module")
async def test_stepping_aside_is_bounded_and_never_delays_a_first_piece(stepping: SteppingLlm) -> None:
    stepping.first_audio.begin()  # first-audio work that does not end while these replies decode
    try:
        before = stepping.paused_s()
        short = await stepping.reply(FIRST_PIECE_TOKENS)  # all of it is its first piece
        assert short and stepping.paused_s() == before
        started = time.monotonic()
        await stepping.reply(12)  # pauses for its budget, then finishes
        paused = stepping.paused_s() - before
        assert BUDGET_S * 0.9 < paused < BUDGET_S * 1.5
        assert time.monotonic() - started >= paused
    finally:
        stepping.first_audio.end()
