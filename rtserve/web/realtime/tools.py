"""Function calling on the realtime routes: ``tools``/``tool_choice`` of ``session.update``
and the ``function_call`` / ``function_call_output`` items of ``conversation.item.create``,
in OpenAI Realtime's shapes (``RealtimeFunctionTool``, ``ToolChoiceFunction``,
``RealtimeConversationItemFunctionCall(Output)`` in the ``openai`` package).

A malformed field is ``invalid_event`` naming it; a tool kind other than ``function`` (MCP
servers) is ``invalid_value``. Whether the schemas compile and a forced name exists is
checked where the session applies the update (``SessionConfig.updated``), against the tools
the session has after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, TypeAdapter, ValidationError

from rtserve.engines.values import ToolChoice, ToolSpec
from rtserve.errors import INVALID_VALUE
from rtserve.sessions import commands as cmd
from rtserve.web.realtime.errors import MAX_ECHOED_CHARS, WireError, field_path, invalid_event


class _FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr = "function"
    name: StrictStr
    description: StrictStr = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class _NamedChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: StrictStr


_TOOLS = TypeAdapter(list[_FunctionTool])
_CHOICE = TypeAdapter(Literal["auto", "none", "required"] | _NamedChoice)


def _parse(adapter: TypeAdapter[Any], value: Any, param: str) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        where = field_path(exc.errors()[0]["loc"])
        raise invalid_event(f"{param}{'.' + where if where else ''}: {exc.errors()[0]['msg']}", param=param) from None


def tool_changes(raw: dict[str, Any], where: str = "session") -> dict[str, Any]:
    """The ``tools``/``tool_choice`` a session (or ``response.create``'s response) object names."""
    changes: dict[str, Any] = {}
    if raw.get("tools") is not None:
        tools = _parse(_TOOLS, raw["tools"], f"{where}.tools")
        for i, tool in enumerate(tools):
            if tool.type != "function":
                raise WireError(
                    INVALID_VALUE,
                    f"Tools of type {tool.type[:MAX_ECHOED_CHARS]!r} are not supported; use 'function' tools",
                    param=f"{where}.tools[{i}].type",
                )
        changes["tools"] = tuple(ToolSpec(t.name, t.description, t.parameters) for t in tools)
    if raw.get("tool_choice") is not None:
        choice = _parse(_CHOICE, raw["tool_choice"], f"{where}.tool_choice")
        changes["tool_choice"] = (
            ToolChoice("required", choice.name) if isinstance(choice, _NamedChoice) else ToolChoice(choice)
        )
    return changes


def with_response_tools(command: cmd.ResponseCreate, data: dict[str, Any]) -> cmd.ResponseCreate:
    """``response.create`` with the response's own ``tools``/``tool_choice`` (OpenAI's
    per-response overrides; checked against the session's tools when the session applies it)."""
    response = data.get("response")
    if not isinstance(response, dict):
        return command
    try:
        overrides = tool_changes(response, "response")
    except WireError as exc:
        exc.event_id = command.event_id
        raise
    return dataclasses.replace(command, **overrides) if overrides else command


class _FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | None = None
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr


class _FunctionOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | None = None
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr


class _FunctionItemCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    event_id: StrictStr | None = None
    previous_item_id: StrictStr | None = None
    item: _FunctionCallItem | _FunctionOutputItem = Field(discriminator="type")


def function_item(data: dict[str, Any]) -> cmd.FunctionItemCreate | None:
    """The command of a ``conversation.item.create`` adding a function item (None for other items)."""
    item = data.get("item")
    if not isinstance(item, dict) or item.get("type") not in ("function_call", "function_call_output"):
        return None
    try:
        e = _FunctionItemCreate.model_validate(data)
    except ValidationError as exc:
        where = field_path(exc.errors()[0]["loc"])
        event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
        raise invalid_event(f"'{where}': {exc.errors()[0]['msg']}", param=where or None, event_id=event_id) from None
    i = e.item
    if isinstance(i, _FunctionCallItem):
        return cmd.FunctionItemCreate(
            kind="function_call",
            call_id=i.call_id,
            name=i.name,
            arguments=i.arguments,
            previous_item_id=e.previous_item_id,
            item_id=i.id,
            event_id=e.event_id,
        )
    return cmd.FunctionItemCreate(
        kind="function_call_output",
        call_id=i.call_id,
        output=i.output,
        previous_item_id=e.previous_item_id,
        item_id=i.id,
        event_id=e.event_id,
    )
