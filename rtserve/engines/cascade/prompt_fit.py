"""Fitting a conversation into the LLM's prompt budget with bounded tokenizer work.

Why a module of its own (issue 17, item 2): re-templating and re-tokenizing the whole
conversation after dropping each oldest turn is quadratic, and it runs on the one LLM
thread; 40 items of 100 KB held that thread ~59 s for every session. Here the work is
bounded by the budget, not by the conversation:

1. **Characters.** No token covers more than ``max_token_chars`` characters (the longest
   token string of the vocabulary), so a turn of ``c`` characters costs at least
   ``c / max_token_chars`` tokens. Walking from the newest turn, every turn older than
   what the budget could possibly hold is dropped without being tokenized, and a prompt
   whose fixed part (system turns and the newest turn) cannot fit is refused the same way.
   What reaches the tokenizer is at most about ``2 * budget * max_token_chars`` characters.
2. **Counts.** Each remaining turn is tokenized once, alone (plus the template's per-turn
   overhead); the newest run of turns whose counts fit is kept.
3. **Check.** The kept turns are templated once. Tokens can merge differently inside the
   template, so if the result is still over the budget, the oldest kept turns covering the
   measured overshoot go and it is templated again (each pass drops at least one turn).

System turns and the newest turn are never dropped; without ``fit_history`` nothing is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.errors import CONTEXT_LENGTH_EXCEEDED

Turn = dict[str, Any]  # a chat-template message: "role", "content" (and whatever the template reads)
Render = Callable[[list[Turn]], Sequence[int]]  # turns -> templated prompt ids (with the generation prompt)
Count = Callable[[str], int]  # text -> its token count, without special tokens


def max_token_chars(vocabulary: dict[str, int]) -> int:
    """The longest token string: an upper bound on the characters one token decodes to
    (byte-level and SentencePiece token strings are never shorter than their text)."""
    return max(1, max((len(token) for token in vocabulary), default=1))


def turn_overhead(render: Render, count: Count) -> int:
    """Tokens the template adds around one turn's content (role markers, separators), measured
    on an alternating user/assistant exchange (the one order every chat template accepts).
    0 when the template refuses even that: a lower estimate only costs step 3 another pass."""
    exchange: list[Turn] = [{"role": role, "content": "a"} for role in ("user", "assistant", "user")]
    try:
        lengths = [len(render(exchange[:n])) for n in (1, 2, 3)]
    except Exception:  # noqa: BLE001 - a template's own refusal (jinja raise_exception), whatever its type
        return 0
    return max(0, min(lengths[1] - lengths[0], lengths[2] - lengths[1]) - count("a"))


def _text(turn: Turn) -> str:
    content = turn.get("content")
    return content if isinstance(content, str) else ""


def _too_long(needed: str, max_tokens: int, context: int) -> EngineError:
    return EngineError(
        f"the prompt needs {needed} tokens; with max_tokens={max_tokens} it exceeds this model's "
        f"context of {context} tokens",
        code=CONTEXT_LENGTH_EXCEEDED,
    )


def fit_prompt(
    turns: Sequence[Turn],
    *,
    context: int,
    max_tokens: int,
    fit_history: bool,
    render: Render,
    count: Count,
    token_chars: int,
    overhead: int,
) -> list[int]:
    """The templated prompt ids of ``turns`` within ``context - max_tokens`` tokens.

    With ``fit_history`` the oldest non-system turns (never the newest) go until it fits;
    otherwise, or when the fixed turns alone are too long, ``context_length_exceeded``.
    """
    budget = context - max_tokens
    last = len(turns) - 1
    fixed_turns = {i for i, t in enumerate(turns) if i == last or t.get("role") == "system" or not fit_history}
    pinned = sorted(fixed_turns)
    droppable = [i for i in range(len(turns)) if i not in fixed_turns]

    # 1. characters: a lower bound of every turn's tokens, no tokenizer involved.
    def at_least(i: int) -> int:
        return math.ceil(len(_text(turns[i])) / token_chars) + overhead

    fixed = sum(at_least(i) for i in pinned)
    if fixed > budget:
        raise _too_long(f"at least {fixed}", max_tokens, context)
    kept = _newest_within(droppable, at_least, budget - fixed)

    # 2. counts: each surviving turn tokenized once.
    counts = {i: count(_text(turns[i])) + overhead for i in [*pinned, *kept]}
    kept = _newest_within(kept, counts.__getitem__, budget - sum(counts[i] for i in pinned))

    # 3. check: template the survivors; drop by the measured overshoot while still over.
    while True:
        chosen = sorted([*pinned, *kept])
        ids = list(render([turns[i] for i in chosen]))
        over = len(ids) - budget
        if over <= 0:
            return ids
        if not kept:
            raise _too_long(str(len(ids)), max_tokens, context)
        while kept and over > 0:
            over -= counts[kept.pop(0)]


def _newest_within(indices: list[int], cost: Callable[[int], int], room: int) -> list[int]:
    """The newest run of ``indices`` (in order) whose costs add up to at most ``room``."""
    start = len(indices)
    while start > 0 and cost(indices[start - 1]) <= room:
        room -= cost(indices[start - 1])
        start -= 1
    return indices[start:]
