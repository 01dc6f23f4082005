"""Function calling on ``/v1/chat/completions``: OpenAI's ``tools``, ``tool_choice``,
assistant ``tool_calls`` and ``role: "tool"`` messages in, ``message.tool_calls`` and
stream ``delta.tool_calls`` out (shapes as in the ``openai`` package's chat types).

Only ``function`` tools exist here; a custom tool or an ``allowed_tools`` choice is a
400 ``invalid_value`` naming the field, as is a bad schema or a forced name not in ``tools``
(``rtserve.engines.tools.check_tools``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from rtserve.config import SessionLimits
from rtserve.engines.tools import InvalidTools, check_tools
from rtserve.engines.values import ToolCall, ToolCallDelta, ToolChoice, ToolSpec
from rtserve.web.errors import ApiError


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "strict": every call is constrained anyway

    name: StrictStr
    description: StrictStr = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionIn


class _NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: _NamedFunction


ToolChoiceIn = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: StrictStr


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: StrictStr
    type: Literal["function"] = "function"
    function: CalledFunction

    def to_engine(self) -> ToolCall:
        return ToolCall(self.id, self.function.name, self.function.arguments)


def engine_tools(
    tools: list[ToolIn] | None, choice: ToolChoiceIn | None, limits: SessionLimits
) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
    """The request's tools for the engine; 400 ``invalid_value`` for a set it cannot serve or
    one over ``sessions.max_tools``/``sessions.max_tool_schema_bytes``. Compiles the schemas:
    a route calls it on the codec executor when the request has tools."""
    specs = tuple(ToolSpec(t.function.name, t.function.description, t.function.parameters) for t in tools or ())
    if isinstance(choice, NamedToolChoice):
        engine_choice = ToolChoice("required", choice.function.name)
    else:
        # OpenAI's default: "auto" with tools, "none" without.
        engine_choice = ToolChoice(choice or ("auto" if specs else "none"))
    try:
        check_tools(specs, engine_choice, max_tools=limits.max_tools, max_schema_bytes=limits.max_tool_schema_bytes)
    except InvalidTools as exc:
        raise ApiError(exc.message, code=exc.code, param=exc.param) from None
    return specs, engine_choice


class CallsSoFar:
    """The calls of one choice as their deltas arrive (index -> id, name, arguments)."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, delta: ToolCallDelta) -> None:
        call = self._calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
        if delta.call_id:
            call["id"], call["name"] = delta.call_id, delta.name or ""
        call["arguments"] += delta.arguments

    def message_field(self) -> list[dict[str, Any]]:
        """``message.tool_calls`` of a non-streamed choice."""
        return [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(self._calls.items())
        ]


def stream_delta(delta: ToolCallDelta) -> dict[str, Any]:
    """``delta.tool_calls`` of one chunk: the first piece of a call carries its id and name."""
    function: dict[str, Any] = {"arguments": delta.arguments}
    call: dict[str, Any] = {"index": delta.index, "function": function}
    if delta.call_id is not None:
        call.update(id=delta.call_id, type="function")
        function["name"] = delta.name
    return {"tool_calls": [call]}
