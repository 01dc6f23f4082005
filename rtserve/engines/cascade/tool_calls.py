"""Function calling on the cascade LLM: the prompt convention and constrained call decoding.

Prompt. A chat template that knows tools (its source mentions ``tools``) gets them as
transformers passes them (``apply_chat_template(tools=...)``, OpenAI-shaped assistant
``tool_calls`` and ``tool`` turns). SmolLM2's template has no tool format, so for such
templates the server uses one documented JSON convention (README "Function calling"), the
Hermes/Qwen one: the system turn lists the tools as JSON inside ``<tools>``; a call is
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; a result is a ``tool``
turn holding the result as the client wrote it (SmolLM2's template renders any role;
measured on it, a result in Hermes' ``<tool_response>`` user turn is parroted back verbatim,
a bare ``tool`` turn is answered in words).

Decoding. A 135M model cannot be trusted to write a call, so every call is generated under
a grammar (llguidance, a logits mask per token on the LLM thread): the text after
``<tool_call>`` must be ``{"name": "<a tool>", "arguments": <JSON following that tool's
schema>}`` (compact JSON). ``tool_choice`` picks when the grammar applies:

* ``required`` / a named function: ``<tool_call>\\n`` ends the prompt and the whole reply is
  one call (to that function, or to any tool);
* ``auto``: the model writes freely; text that could start ``<tool_call>`` is held back, and
  once the marker is written the rest of the reply is a constrained call (the marker is
  never shown as text);
* ``none``: tools are not shown to the model and nothing is constrained.

One call per reply (no parallel calls): the reply ends when the call is complete, with
``finish_reason="tool_calls"``. A call the token budget (``max_tokens``, the context) cuts
short ends with ``finish_reason="length"`` and its arguments as far as they got, as OpenAI's
do: a client must not parse them. Any other end of an unfinished call (the grammar engine
gives up, or nothing the grammar allows is left) is a typed ``generation_failed``, never a
``stop`` with broken JSON.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.engines.tools import arguments_schema, openai_tools, openai_turns
from rtserve.engines.values import ChatMessage, SamplingParams, ToolCallDelta, ToolSpec
from rtserve.errors import GENERATION_FAILED

log = logging.getLogger(__name__)

CALL_OPEN = "<tool_call>"
_CALL_HEAD = re.compile(r'^\s*\{"name": "([A-Za-z0-9_-]{1,64})", "arguments": ')


def uses_tools(params: SamplingParams) -> bool:
    return bool(params.tools) and params.tool_choice.mode != "none"


def forced(params: SamplingParams) -> bool:
    return uses_tools(params) and params.tool_choice.mode == "required"


def template_knows_tools(tokenizer: Any) -> bool:
    return "tools" in (tokenizer.chat_template or "")


def _call_json(name: str, arguments: str) -> str:
    return f'{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}'


def render(
    messages: Sequence[ChatMessage], params: SamplingParams, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Chat-template turns (and the ``tools`` argument, for a template that takes it)."""
    show_tools = uses_tools(params)
    if native:
        return openai_turns(messages), openai_tools(params.tools) if show_tools else None
    turns = []
    for m in messages:
        if m.tool_calls:
            calls = "\n".join(f"{CALL_OPEN}\n{_call_json(c.name, c.arguments)}\n</tool_call>" for c in m.tool_calls)
            turns.append({"role": "assistant", "content": f"{m.content}\n{calls}" if m.content else calls})
        else:
            turns.append({"role": m.role, "content": m.content})
    if show_tools:
        listing = "\n".join(
            json.dumps({"name": t.name, "description": t.description, "parameters": dict(t.parameters)})
            for t in params.tools
        )
        block = (
            "You can call functions. Their JSON schemas:\n<tools>\n" + listing + "\n</tools>\n"
            "To call one, reply with exactly:\n"
            + CALL_OPEN
            + '\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>'
        )
        if turns and turns[0]["role"] == "system":
            turns[0] = {"role": "system", "content": f"{turns[0]['content']}\n\n{block}"}
        else:
            turns.insert(0, {"role": "system", "content": block})
    return turns, None


def call_grammar(tools: Sequence[ToolSpec]) -> str:
    """Lark grammar (llguidance) for what follows ``<tool_call>``: one call to one of ``tools``
    (a few blank characters first, bounded so a model cannot idle in whitespace)."""
    rules, alternatives = [], []
    for i, tool in enumerate(tools):
        schema = {**arguments_schema(tool), "x-guidance": {"whitespace_flexible": False}}
        head = json.dumps(f'{{"name": "{tool.name}", "arguments": ')
        alternatives.append(f"call{i}")
        rules.append(f'call{i}: {head} args{i} "}}"\nargs{i}: %json {json.dumps(schema)}')
    return "start: /[ \\t\\n]{0,4}/ (" + " | ".join(alternatives) + ")\n" + "\n".join(rules)


@dataclass
class CallDecoding:
    """Per request, on the LLM thread: the grammar mask while a call is written, and the
    split of the decoded reply into visible text and call deltas."""

    guide: Any  # CallGuide of the decoder
    grammar: str
    constraining: bool  # the grammar applies to the next token
    call_start: int | None = None  # char offset of the call body in the decoded reply
    matcher: Any = None
    name: str | None = None
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    sent_args: int = 0  # argument characters already delivered
    complete: bool = False
    failed: bool = False

    def __post_init__(self) -> None:
        if self.constraining:
            self.call_start = 0
            self.matcher = self.guide.matcher(self.grammar)

    def mask(self, logits: Any) -> None:
        if self.constraining:
            self.guide.mask(self.matcher, logits)

    def consume(self, token: int) -> None:
        if self.constraining:
            self._consume([token])

    def fast_forward(self, room: int) -> list[int]:
        """The tokens the grammar allows no alternative to (a call's ``{"name": ..., "arguments":``
        head, a forced key), at most ``room``, consumed now: the decoder feeds them to the model
        in one forward pass instead of one pass each."""
        if not self.constraining or self.complete or self.failed or room <= 0:
            return []
        tokens = list(self.matcher.compute_ff_tokens())[:room]
        if tokens:
            self._consume(tokens)
        return tokens

    def _consume(self, tokens: list[int]) -> None:
        self.matcher.consume_tokens(tokens)
        self.failed = self.matcher.is_error()  # an error also stops the matcher: not a complete call
        self.complete = self.matcher.is_stopped() and not self.failed

    def unfinished(self) -> EngineError:
        """The error of a reply that ended inside its call, other than by the token budget."""
        # llguidance's error carries its whole parser state: its first line says what stopped it.
        reason = self.matcher.get_error().split("\n", 1)[0][:200] if self.failed else "the reply ended inside it"
        log.warning("constrained function call %s not finished: %s", self.name, reason)
        return EngineError("the function call could not be completed under its schema", code=GENERATION_FAILED)

    def visible_end(self, text: str) -> int:
        """How much of ``text`` (the decoded reply so far) is ordinary text the client may
        see now; starts constraining when the call marker appears."""
        if self.call_start is not None:
            return self.call_start if self.call_start == 0 else self.call_start - len(CALL_OPEN)
        at = text.find(CALL_OPEN)
        if at >= 0:
            self.call_start = at + len(CALL_OPEN)
            self.matcher = self.guide.matcher(self.grammar)
            tail = self.guide.encode(text[self.call_start :])  # the marker's token may have carried more
            if tail and self.matcher.try_consume_tokens(tail) != len(tail):
                self.failed = True
            self.constraining = True
            self.failed = self.failed or self.matcher.is_error()
            self.complete = self.matcher.is_stopped() and not self.failed
            return at
        # Hold back a tail that could still become the marker.
        for keep in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
            if CALL_OPEN.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)

    def call_delta(self, text: str, index: int = 0) -> ToolCallDelta | None:
        """The next piece of the call in ``text`` (None when nothing new is known yet)."""
        if self.call_start is None:
            return None
        body = text[self.call_start :]
        head = _CALL_HEAD.match(body)
        if head is None:
            return None
        first = self.name is None
        self.name = head.group(1)
        args = body[head.end() :]
        # The last character is held back: once the call is complete it is the wrapper's closing brace.
        ready = args[:-1]
        piece = ready[self.sent_args :]
        self.sent_args = max(self.sent_args, len(ready))
        if not piece and not first:
            return None
        return ToolCallDelta(index, piece, self.call_id if first else None, self.name if first else None)


class CallGuide:
    """The model's llguidance tokenizer and mask buffer, built once per loaded model."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance.hf
        import llguidance.torch

        self._tokenizer = tokenizer
        self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, self._ll_tokenizer.vocab_size)

    def start(self, params: SamplingParams) -> CallDecoding | None:
        if not uses_tools(params):
            return None
        choice = params.tool_choice
        tools = [t for t in params.tools if choice.name is None or t.name == choice.name]
        return CallDecoding(self, call_grammar(tools), constraining=forced(params))

    def matcher(self, grammar: str) -> Any:
        import llguidance

        return llguidance.LLMatcher(self._ll_tokenizer, grammar)

    def mask(self, matcher: Any, logits: Any) -> None:
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(matcher, self._bitmask, 0)
        llguidance.torch.apply_token_bitmask_inplace(logits, self._bitmask[0])

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))
