"""Function calling through the vLLM text engine, the way ``vllm serve`` does it.

* The prompt: the model's own chat template gets the tools and the OpenAI-shaped history
  (``rtserve.engines.tools.openai_tools``/``openai_turns``).
* A forced call (``tool_choice`` naming a function, or ``required``): vLLM's structured
  outputs constrain the text to JSON; for a named function it is the arguments themselves
  (streamed as argument pieces of one call), for ``required`` an object ``{"name",
  "arguments"}`` over the tools (one call, delivered when complete).
* ``auto``: vLLM's own tool parser for the model family (``http.vllm.tool_call_parser``, as
  ``vllm serve --tool-call-parser``) reads the finished text, so with tools in ``auto`` the
  reply's text arrives when it is complete, then its calls. Without a parser ``auto`` is
  refused with the fix, as ``vllm serve`` refuses it without ``--enable-auto-tool-choice``.

vLLM is imported only inside these functions (it is optional).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from rtserve.engines.protocols import EngineError, SamplingParams, TokenDelta, ToolCallDelta
from rtserve.engines.tools import arguments_schema, openai_tools
from rtserve.errors import INVALID_VALUE


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def forced_schema(params: SamplingParams) -> dict[str, Any]:
    """The JSON schema a forced reply follows (see the module note)."""
    choice = params.tool_choice
    if choice.name is not None:
        return arguments_schema(next(t for t in params.tools if t.name == choice.name))
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": arguments_schema(t)},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in params.tools]}


def structured_json(schema: dict[str, Any]) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments constraining the output to ``schema``."""
    try:  # vLLM >= 0.10.2
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(json=schema)}
    return {"structured_outputs": StructuredOutputsParams(json=schema)}


async def forced_call(deltas: AsyncIterator[TokenDelta], params: SamplingParams) -> AsyncIterator[TokenDelta]:
    """The constrained JSON of a forced reply as one call (finish ``tool_calls`` unless cut by length)."""
    name = params.tool_choice.name
    text: list[str] = []
    first = True
    async for delta in deltas:
        finish = delta.finish_reason
        if finish == "stop":
            finish = "tool_calls"
        if name is not None:  # the text is the arguments: stream it
            call = ToolCallDelta(0, delta.text, _call_id() if first else None, name if first else None)
            first = False
            yield TokenDelta("", finish, delta.prompt_tokens, delta.completion_tokens, tool_call=call)
            continue
        text.append(delta.text)
        if delta.finish_reason is None:
            continue
        try:
            chosen = json.loads("".join(text))
            call = ToolCallDelta(0, json.dumps(chosen["arguments"]), _call_id(), chosen["name"])
        except (ValueError, KeyError, TypeError):  # cut off by max_tokens before the JSON closed
            yield TokenDelta("", delta.finish_reason, delta.prompt_tokens, delta.completion_tokens)
            return
        yield TokenDelta("", finish, delta.prompt_tokens, delta.completion_tokens, tool_call=call)


def auto_parser(parser_name: str | None, tokenizer: Any) -> Any:
    """vLLM's tool parser instance for one request (``EngineError`` when none is configured)."""
    if parser_name is None:
        raise EngineError("tool_choice 'auto' with tools needs a tool parser on the vLLM engine: set "
                          "http.vllm.tool_call_parser (as vllm serve --tool-call-parser), or force a function",
                          code=INVALID_VALUE, param="tool_choice")
    try:
        from vllm.entrypoints.openai.tool_parsers import ToolParserManager
    except ImportError:  # newer vLLM moved the parsers
        from vllm.tool_parsers import ToolParserManager  # type: ignore[no-redef]
    return ToolParserManager.get_tool_parser(parser_name)(tokenizer)


async def parsed_calls(deltas: AsyncIterator[TokenDelta], parser: Any, params: SamplingParams,
                       model: str) -> AsyncIterator[TokenDelta]:
    """The finished reply through vLLM's tool parser: its text, then each call it found."""
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest

    text: list[str] = []
    async for delta in deltas:
        text.append(delta.text)
        if delta.finish_reason is None:
            continue
        # The parsers read the request's tools, not its history (whose template form, with parsed
        # arguments, is not the request's own).
        request = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": ""}],
                                        tools=openai_tools(params.tools), tool_choice="auto")
        found = parser.extract_tool_calls("".join(text), request)
        if not found.tools_called:
            yield TokenDelta("".join(text), delta.finish_reason, delta.prompt_tokens, delta.completion_tokens)
            return
        calls = list(found.tool_calls)
        if found.content:
            yield TokenDelta(found.content, None, delta.prompt_tokens, delta.completion_tokens)
        for i, call in enumerate(calls):
            piece = ToolCallDelta(i, call.function.arguments, call.id or _call_id(), call.function.name)
            last = i == len(calls) - 1
            yield TokenDelta("", "tool_calls" if last else None, delta.prompt_tokens, delta.completion_tokens,
                             tool_call=piece)
