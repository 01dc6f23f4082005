"""Function tools as the engines take them: checks shared by every transport.

Clients name tools the OpenAI way (HTTP ``tools``/``tool_choice``, realtime
``session.update``); each transport parses its own wire shape into ``ToolSpec`` and
``ToolChoice`` and calls ``check_tools`` once, where the request enters, so a bad schema
or an unknown forced name is a typed ``invalid_value`` naming the field before any model
work. A schema is checked by compiling it with llguidance, the same library the cascade
LLM constrains its decoding with, so every accepted schema is one a forced call can follow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, ToolChoice, ToolSpec
from rtserve.errors import INVALID_VALUE

MAX_TOOLS = 128  # OpenAI's own limit on tools per request
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's function name rule


class InvalidTools(EngineError):
    code = INVALID_VALUE


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """The schema a call's arguments follow. Properties the tool does not declare are not
    generated (``additionalProperties: false`` unless the schema says otherwise), as in
    OpenAI's strict mode: a small model would otherwise invent keys."""
    schema = {"type": "object", **tool.parameters}
    schema.setdefault("additionalProperties", False)
    return schema


def openai_tools(tools: Sequence[ToolSpec], *, strict: bool = False) -> list[dict[str, Any]]:
    """``tools`` as chat templates (transformers, vLLM) take them: OpenAI's chat shape.
    ``strict``: OpenAI's strict mode, the arguments constrained to ``arguments_schema``."""
    if strict:
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "strict": True,
                    "parameters": arguments_schema(t),
                },
            }
            for t in tools
        ]
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
        }
        for t in tools
    ]


def openai_turns(messages: Sequence[ChatMessage], *, arguments_as_text: bool = False) -> list[dict[str, Any]]:
    """Messages as chat templates that know tools take them: assistant ``tool_calls`` with
    their arguments parsed (templates index them), ``tool`` turns with ``tool_call_id``.
    ``arguments_as_text``: the arguments as the JSON text they are (the OpenAI HTTP wire)."""
    turns = []
    for m in messages:
        turn: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            turn["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": c.arguments if arguments_as_text else _parsed(c.arguments),
                    },
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            turn["tool_call_id"] = m.tool_call_id
        turns.append(turn)
    return turns


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except ValueError:  # a client's own malformed call: the template gets it as written
        return arguments


def check_tools(tools: Sequence[ToolSpec], choice: ToolChoice, param: str = "tools") -> None:
    """Raise ``InvalidTools`` (``param`` names the field) for a set no engine could serve."""
    if len(tools) > MAX_TOOLS:
        raise InvalidTools(f"at most {MAX_TOOLS} tools are allowed, got {len(tools)}", param=param)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not _NAME.match(tool.name):
            raise InvalidTools(
                f"Invalid function name {tool.name[:64]!r}: use 1-64 letters, digits, '_' or '-'",
                param=f"{param}[{i}].name",
            )
        if tool.name in seen:
            raise InvalidTools(f"Duplicate function name {tool.name!r}", param=f"{param}[{i}].name")
        seen.add(tool.name)
        problem = schema_problem(tool.parameters)
        if problem:
            raise InvalidTools(
                f"Invalid schema for function {tool.name!r}: {problem}", param=f"{param}[{i}].parameters"
            )
    choice_param = "tool_choice" if param == "tools" else param.rsplit(".", 1)[0] + ".tool_choice"
    if choice.name is not None and choice.name not in seen:
        raise InvalidTools(
            f"tool_choice names function {choice.name[:64]!r}, which is not in tools", param=choice_param
        )
    if choice.mode == "required" and not tools:
        raise InvalidTools("tool_choice requires a tool call but no tools are given", param=choice_param)


def schema_problem(schema: Mapping[str, Any]) -> str:
    """Why ``schema`` is not a usable JSON schema for arguments ("" when it is)."""
    import llguidance

    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        return "the parameters must be a JSON schema of type 'object'"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(dict(schema)))
    except (TypeError, ValueError) as exc:  # not serializable / not JSON
        return str(exc)[:200]
    return llguidance.LLMatcher.validate_grammar(grammar)[:200]
