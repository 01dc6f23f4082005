"""Tool calls in the SmolLM2 decode loop with its real tokenizer and the real llguidance mask.

The model's next-token logits are replaced by a script (one-hot on the scripted token), so
what is tested is exactly the decoder's own work: masking, the split of the reply into
visible text and call pieces, and the finish reason. The model itself writing a forced
call is tested over HTTP and realtime (``tests/web/http/test_function_calling.py``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry

from rtserve.engines.cascade.llm import SmolLlm, _Decoder, _Request
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.tool_calls import CallGuide
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta, ToolChoice, ToolSpec

pytestmark = pytest.mark.models

WEATHER = ToolSpec(
    "get_weather",
    "Weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
)


CLOCK = ToolSpec("get_time", "Time in a zone", {"type": "object", "properties": {"zone": {"type": "string"}}})


def scripted(
    transformers_llm: SmolLlm,
    reply: str,
    choice: ToolChoice,
    tools: tuple[ToolSpec, ...] = (WEATHER,),
    max_tokens: int = 200,
) -> list[TokenDelta]:
    """Decode ``reply`` token by token through the decoder with tools offered."""
    loaded = transformers_llm.loaded
    assert loaded is not None
    decoder = _Decoder(loaded, 2048, CascadeMetrics(CollectorRegistry()))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, tools=tools, tool_choice=choice)
    request = _Request((ChatMessage("user", "hi"),), params, False, lambda item: None)
    vocab = loaded.model.config.vocab_size
    request.calls = CallGuide(loaded.tokenizer, vocab).start(params)
    script = [*loaded.tokenizer.encode(reply, add_special_tokens=False), loaded.tokenizer.eos_token_id]
    deltas: list[TokenDelta] = []
    while not deltas or deltas[-1].finish_reason is None:
        # The next scripted token is the one after what was generated: tokens the grammar
        # forced (fast-forwarded) stand in for the script's own.
        request.logits = torch.full((vocab,), -10.0)
        request.logits[script[min(len(request.generated), len(script) - 1)]] = 10.0
        if (delta := decoder.emit_next(request)) is not None:
            deltas.append(delta)
    return deltas


def test_auto_reply_that_calls_shows_the_text_before_the_call_and_never_the_marker(transformers_llm: SmolLlm) -> None:
    arguments = '{"city":"Paris","unit":"celsius"}'
    deltas = scripted(
        transformers_llm,
        f'Let me check. <tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call> and more',
        ToolChoice("auto"),
    )
    text = "".join(d.text for d in deltas)
    assert text == "Let me check. "  # nothing of "<tool_call>" leaked, even held-back prefixes of it
    calls = [d.tool_call for d in deltas if d.tool_call is not None]
    assert (calls[0].name, calls[0].index) == ("get_weather", 0) and (calls[0].call_id or "").startswith("call_")
    assert all(c.name is None and c.call_id is None for c in calls[1:])
    assert "".join(c.arguments for c in calls) == arguments
    assert deltas[-1].finish_reason == "tool_calls"  # the reply ends with the call
    # The call's fixed head ({"name": "get_weather", "arguments": {"city) is forced by the
    # grammar: it enters the model in one forward pass, not one pass per token.
    assert max(b.completion_tokens - a.completion_tokens for a, b in itertools.pairwise(deltas)) >= 10


def test_auto_reply_without_a_call_keeps_every_character(transformers_llm: SmolLlm) -> None:
    deltas = scripted(transformers_llm, "Is 1 <tool or 2 < 3? <tool_c", ToolChoice("auto"))
    assert "".join(d.text for d in deltas) == "Is 1 <tool or 2 < 3? <tool_c"
    assert deltas[-1].finish_reason == "stop" and all(d.tool_call is None for d in deltas)


def test_the_mask_keeps_a_call_to_the_schema(transformers_llm: SmolLlm) -> None:
    # The script tries an argument the schema does not declare and an unknown unit: the mask
    # refuses those tokens, so what comes out still follows the schema.
    deltas = scripted(
        transformers_llm,
        '<tool_call>\n{"name": "get_weather", "arguments": {"town":"Paris","unit":"kelvin"}}',
        ToolChoice("auto"),
    )
    arguments = "".join(d.tool_call.arguments for d in deltas if d.tool_call is not None)
    assert deltas[-1].finish_reason == "tool_calls"
    parsed = json.loads(arguments)
    assert set(parsed) == {"city", "unit"} and parsed["unit"] in ("celsius", "fahrenheit")


def test_required_lets_the_model_pick_among_the_tools_and_shows_no_text(transformers_llm: SmolLlm) -> None:
    # With "required" the reply is a call from its first token (the prompt ends with the marker).
    deltas = scripted(
        transformers_llm, '{"name": "get_time", "arguments": {"zone":"UTC"}}', ToolChoice("required"), (WEATHER, CLOCK)
    )
    assert not "".join(d.text for d in deltas)
    calls = [d.tool_call for d in deltas if d.tool_call is not None]
    assert calls[0].name == "get_time" and json.loads("".join(c.arguments for c in calls)) == {"zone": "UTC"}
    assert deltas[-1].finish_reason == "tool_calls"


def test_a_call_cut_short_by_the_token_budget_ends_with_length(transformers_llm: SmolLlm) -> None:
    # As OpenAI's: finish_reason "length" says the arguments are unfinished (never "tool_calls").
    deltas = scripted(
        transformers_llm,
        '{"name": "get_weather", "arguments": {"city":"A very long city name indeed","unit":"celsius"}}',
        ToolChoice("required"),
        max_tokens=16,
    )
    assert deltas[-1].finish_reason == "length"
    arguments = "".join(d.tool_call.arguments for d in deltas if d.tool_call is not None)
    with pytest.raises(ValueError):
        json.loads(arguments)


@pytest.mark.parametrize(
    "schema",
    [
        # An empty language (a $ref to itself): after {"a": nothing is allowed; it used to end
        # as {"a" with finish_reason "stop".
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/n"}},
            "required": ["a"],
            "$defs": {"n": {"$ref": "#/$defs/n"}},
        },
        # An endless object: llguidance gives up ("too many items"); it used to end as "tool_calls".
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    ],
)
def test_a_call_the_grammar_cannot_finish_is_a_typed_error(transformers_llm: SmolLlm, schema: dict[str, Any]) -> None:
    # check_tools refuses these schemas where requests enter; the decoder still never reports
    # an unfinished call as a finished one.
    with pytest.raises(EngineError) as err:
        scripted(
            transformers_llm,
            '{"name": "f", "arguments": {"a":{"a":{"a":',
            ToolChoice("required"),
            (ToolSpec("f", "", schema),),
        )
    assert err.value.code == "generation_failed"
