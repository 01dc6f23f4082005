"""``check_tools``: the bounds on a client's tool set, recursive schemas, the verdict cache."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rtserve.engines import tools as tools_module
from rtserve.engines.tools import InvalidTools, check_tools
from rtserve.engines.values import ToolChoice, ToolSpec


def tool(name: str, schema: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name, "", schema)


def fresh(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` made unlike any other (the verdict cache is process-wide)."""
    return {**schema, "description": uuid.uuid4().hex}


NODE = {"type": "object", "properties": {"value": {"type": "integer"}}}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},  # endless object
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"$ref": "#/$defs/n"}}},
        {  # a tree: still refused, no grammar bounds its depth
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
        },
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/definitions/m"}},
            "definitions": {"m": {"anyOf": [{"$ref": "#/definitions/k"}]}, "k": {"$ref": "#/definitions/m"}},
        },
    ],
)
def test_a_recursive_schema_is_refused_naming_the_tool(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidTools) as err:
        check_tools((tool("f", fresh(schema)),), ToolChoice("required", "f"))
    assert err.value.param == "tools[0].parameters" and "recursive" in err.value.message


def test_shared_definitions_without_a_cycle_are_accepted() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/node"}, "b": {"$ref": "#/$defs/node"}},
        "$defs": {"node": NODE, "unused": {"$ref": "#/$defs/unused"}},  # never referred to: never generated
    }
    check_tools((tool("f", fresh(schema)),), ToolChoice("required", "f"))


def test_bounds_are_checked_before_any_schema_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[object] = []

    def counted(schema: object) -> str:
        compiled.append(schema)
        return ""

    monkeypatch.setattr(tools_module, "_compile_problem", counted)
    many = tuple(tool(f"t{i}", fresh(NODE)) for i in range(5))
    with pytest.raises(InvalidTools) as err:
        check_tools(many, ToolChoice("auto"), max_tools=4)
    assert (err.value.param, err.value.message) == ("tools", "at most 4 tools are allowed, got 5")
    with pytest.raises(InvalidTools) as err:
        check_tools(many, ToolChoice("auto"), "response.tools", max_schema_bytes=200)
    assert err.value.param == "response.tools" and "more than 200 bytes" in err.value.message
    assert not compiled
    check_tools(many, ToolChoice("auto"), max_tools=5, max_schema_bytes=10_000)
    assert len(compiled) == 5


def test_a_schema_compiles_once_however_often_it_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[object] = []
    real = tools_module._compile_problem

    def counted(schema: Any) -> str:
        compiled.append(schema)
        return real(schema)

    monkeypatch.setattr(tools_module, "_compile_problem", counted)
    good, bad = fresh(NODE), fresh({"type": "object", "required": "city"})
    for _ in range(3):
        check_tools((tool("f", good),), ToolChoice("auto"))
        with pytest.raises(InvalidTools):
            check_tools((tool("g", bad),), ToolChoice("auto"))
    assert compiled == [good, bad]  # the refusal is cached as well as the acceptance
