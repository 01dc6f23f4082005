"""History fitting does bounded tokenizer work (issue 17, item 2): a long conversation is
never re-tokenized per dropped turn, and what reaches the tokenizer is bounded by the
budget, not by the conversation. A word tokenizer stands in for the model's so the work
can be counted; the real one is exercised in ``test_cascade_llm.py``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserve.engines.cascade.prompt_fit import Turn, fit_prompt, max_token_chars, turn_overhead
from rtserve.engines.errors import EngineError

TOKEN_CHARS = 6  # the word tokenizer's longest token, a space included


class WordTokenizer:
    """Tokens are runs of up to 5 letters (each with its leading space); the template wraps
    every turn in 3 tokens and adds 2 for the generation prompt. Counts every character it
    tokenizes. ``merge_bonus`` tokens are added per adjacent pair of turns in a template, to
    model templates whose tokens do not add up."""

    def __init__(self, merge_bonus: int = 0) -> None:
        self.chars_seen = 0
        self.merge_bonus = merge_bonus

    def count(self, text: str) -> int:
        self.chars_seen += len(text)
        return sum(-(-len(word) // 5) for word in text.split())

    def render(self, turns: list[Turn]) -> list[int]:
        tokens = sum(self.count(t["content"]) + 3 for t in turns) + 2 + self.merge_bonus * max(0, len(turns) - 1)
        return list(range(tokens))


def fit(
    tok: WordTokenizer,
    turns: list[Turn],
    *,
    context: int = 512,
    max_tokens: int = 64,
    fit_history: bool = True,
    **kwargs: Any,
) -> list[int]:
    return fit_prompt(
        turns,
        context=context,
        max_tokens=max_tokens,
        fit_history=fit_history,
        render=tok.render,
        count=tok.count,
        token_chars=TOKEN_CHARS,
        overhead=turn_overhead(tok.render, tok.count),
        **kwargs,
    )


def naive_fit(tok: WordTokenizer, turns: list[Turn], budget: int) -> int | None:
    """The old quadratic loop: drop the oldest non-system turn until the template fits."""
    turns = list(turns)
    while True:
        ids = tok.render(turns)
        if len(ids) <= budget:
            return len(ids)
        droppable = [i for i, t in enumerate(turns[:-1]) if t["role"] != "system"]
        if not droppable:
            return None
        del turns[droppable[0]]


def turn(role: str, words: int, word: str = "hello") -> Turn:
    return {"role": role, "content": " ".join([word] * words)}


def test_forty_huge_turns_cost_tokenizer_work_bounded_by_the_budget() -> None:
    tok = WordTokenizer()
    huge = [turn("user" if i % 2 else "assistant", 17_000) for i in range(40)]  # ~100 KB each
    turns = [turn("system", 10), *huge, turn("user", 5, "what")]
    ids = fit(tok, turns)
    assert len(ids) == 10 + 5 + 2 * 3 + 2  # system + question; every huge turn went
    conversation_chars = sum(len(t["content"]) for t in turns)
    assert tok.chars_seen < 2 * 448 * TOKEN_CHARS < conversation_chars / 100


def test_turns_that_fit_are_kept_newest_first_and_counted_once() -> None:
    tok = WordTokenizer()
    turns = [turn("system", 10), *[turn("user", 40) for _ in range(30)], turn("user", 5)]
    ids = fit(tok, turns)
    assert len(ids) == naive_fit(WordTokenizer(), turns, 512 - 64)
    assert len(ids) > 448 - 43  # nothing dropped that would still fit
    kept = (len(ids) - 2 - 13 - 8) // 43
    kept_chars = len(turns[0]["content"]) + len(turns[-1]["content"]) + kept * len(turns[1]["content"])
    assert tok.chars_seen <= 2 * kept_chars + 20  # counted once and templated once (+ the overhead probes)


def test_a_template_longer_than_its_counts_still_ends_within_the_budget() -> None:
    tok = WordTokenizer(merge_bonus=4)
    turns = [turn("system", 10), *[turn("user", 20) for _ in range(40)], turn("user", 5)]
    ids = fit(tok, turns)
    expected = naive_fit(WordTokenizer(merge_bonus=4), turns, 448)
    assert expected is not None and expected - (23 + 4) <= len(ids) <= 448  # at most one turn more than needed


def test_without_fit_history_or_room_the_prompt_is_refused_typed_without_tokenizing_a_huge_one() -> None:
    tok = WordTokenizer()
    with pytest.raises(EngineError) as raised:
        fit(tok, [turn("user", 17_000), turn("user", 5)], fit_history=False)
    assert raised.value.code == "context_length_exceeded"
    assert tok.chars_seen < 100  # judged by characters: only turn_overhead's probes were tokenized
    with pytest.raises(EngineError) as raised:  # the newest turn alone is over the budget
        fit(WordTokenizer(), [turn("user", 10), turn("user", 500)])
    assert raised.value.code == "context_length_exceeded"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.integers(0, 120)), min_size=1, max_size=25),
    st.integers(64, 600),
)
def test_same_prompt_as_dropping_oldest_turns_one_by_one(shape: list[tuple[str, int]], budget: int) -> None:
    turns = [turn(role, words) for role, words in shape]
    expected = naive_fit(WordTokenizer(), turns, budget)
    try:
        got: int | None = len(fit(WordTokenizer(), turns, context=budget + 16, max_tokens=16))
    except EngineError as exc:
        assert exc.code == "context_length_exceeded"
        got = None
    assert got == expected


def test_the_longest_vocabulary_token_bounds_characters_per_token() -> None:
    assert max_token_chars({"a": 0, "Ġhello": 1, "<|im_start|>": 2}) == 12
    assert max_token_chars({}) == 1


def test_a_template_that_refuses_the_probe_still_fits_within_the_budget() -> None:
    class Strict(WordTokenizer):  # e.g. a template that raises on a user turn after a user turn
        def render(self, turns: list[Turn]) -> list[int]:
            if len(turns) <= 3 and [t["role"] for t in turns] == ["user", "assistant", "user"][: len(turns)]:
                raise ValueError("Conversation roles must alternate")
            return super().render(turns)

    tok = Strict()
    assert turn_overhead(tok.render, tok.count) == 0
    turns = [turn("system", 10), *[turn("user", 40) for _ in range(30)], turn("user", 5)]
    ids = fit_prompt(
        turns,
        context=512,
        max_tokens=64,
        fit_history=True,
        render=tok.render,
        count=tok.count,
        token_chars=TOKEN_CHARS,
        overhead=0,
    )
    assert len(ids) == naive_fit(WordTokenizer(), turns, 448)
