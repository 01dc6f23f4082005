"""Function tools as the engines take them: checks shared by every transport.

Clients name tools the OpenAI way (HTTP ``tools``/``tool_choice``, realtime
``session.update``); each transport parses its own wire shape into ``ToolSpec`` and
``ToolChoice`` and calls ``check_tools`` once, where the request enters, so a bad schema
or an unknown forced name is a typed ``invalid_value`` naming the field before any model
work. A schema is checked by compiling it with llguidance, the same library the cascade
LLM constrains its decoding with, so every accepted schema is one a forced call can follow.

Compiling costs about 0.4 us per schema byte (128 schemas of 30 KB: 1.6 s), so the sizes a
client controls are bounded first (``sessions.max_tools``, ``sessions.max_tool_schema_bytes``,
checked before anything compiles) and the transports run the compile on the codec executor,
off the event loop (docs/design.md#processes-threads-and-time). A verdict is kept per schema
text (a bounded cache), so the same tools checked again where the session applies them, by
every ``response.create`` and by the engine cost nothing.

A recursive schema (a ``$ref`` cycle) is refused: llguidance accepts it, but no grammar
bounds it (``{"a": {"$ref": "#"}}`` required is an endless object, a ``$ref`` to itself an
empty language), so a forced call could only end unfinished.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rtserve import untrusted_json
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, ToolChoice, ToolSpec
from rtserve.errors import INVALID_VALUE

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's function name rule
_VERDICTS_KEPT = 1024  # schema verdicts cached (a digest and a short string each)


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
        if m.images:  # OpenAI image parts (data URLs), before the words that ask about them
            images = [{"type": "image_url", "image_url": {"url": url}} for url in m.images]
            turn["content"] = [*images, {"type": "text", "text": m.content}] if m.content else images
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
        return untrusted_json.loads(arguments or "{}")
    except ValueError:  # a client's own malformed call: the template gets it as written
        return arguments


def check_tools(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    param: str = "tools",
    *,
    max_tools: int | None = None,
    max_schema_bytes: int | None = None,
) -> None:
    """Raise ``InvalidTools`` (``param`` names the field) for a set no engine could serve.

    ``max_tools``/``max_schema_bytes`` (all schemas' JSON text together) bound a client's set
    before any schema compiles; None where the transport has bounded it already."""
    if max_tools is not None and len(tools) > max_tools:
        raise InvalidTools(f"at most {max_tools} tools are allowed, got {len(tools)}", param=param)
    seen: set[str] = set()
    schema_bytes = 0
    texts = []
    for i, tool in enumerate(tools):
        if not _NAME.match(tool.name):
            raise InvalidTools(
                f"Invalid function name {tool.name[:64]!r}: use 1-64 letters, digits, '_' or '-'",
                param=f"{param}[{i}].name",
            )
        if tool.name in seen:
            raise InvalidTools(f"Duplicate function name {tool.name!r}", param=f"{param}[{i}].name")
        seen.add(tool.name)
        text = schema_text(tool.parameters)
        schema_bytes += len(text.encode())
        if max_schema_bytes is not None and schema_bytes > max_schema_bytes:
            raise InvalidTools(
                f"the tools' parameter schemas hold more than {max_schema_bytes} bytes of JSON together",
                param=param,
            )
        texts.append(text)
    for i, (tool, text) in enumerate(zip(tools, texts, strict=True)):
        problem = schema_problem(tool.parameters, text)
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


def schema_text(schema: Mapping[str, Any]) -> str:
    """The JSON text of ``schema`` (what the size bound counts and the verdict cache keys)."""
    try:
        return json.dumps(schema, separators=(",", ":"))
    except (TypeError, ValueError):  # not serializable: schema_problem says why
        return repr(schema)


class _Verdicts:
    """Schema verdicts by the digest of the schema's text, least recently used dropped."""

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._lock = threading.Lock()  # the codec executor's threads and the event loop share it
        self._verdicts: OrderedDict[bytes, str] = OrderedDict()

    def get(self, key: bytes) -> str | None:
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                self._verdicts.move_to_end(key)
            return verdict

    def put(self, key: bytes, verdict: str) -> None:
        with self._lock:
            self._verdicts[key] = verdict
            while len(self._verdicts) > self._kept:
                self._verdicts.popitem(last=False)


_verdicts = _Verdicts(_VERDICTS_KEPT)


def schema_problem(schema: Mapping[str, Any], text: str | None = None) -> str:
    """Why ``schema`` is not a usable JSON schema for arguments ("" when it is); ``text``: its
    ``schema_text`` when the caller has it."""
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        return "the parameters must be a JSON schema of type 'object'"
    key = hashlib.sha256((schema_text(schema) if text is None else text).encode()).digest()
    verdict = _verdicts.get(key)
    if verdict is None:
        verdict = _compile_problem(schema)
        _verdicts.put(key, verdict)
    return verdict


def _compile_problem(schema: Mapping[str, Any]) -> str:
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(dict(schema)))
    except (TypeError, ValueError) as exc:  # not serializable / not JSON
        return str(exc)[:200]
    problem = llguidance.LLMatcher.validate_grammar(grammar)[:200]
    if not problem and (cycle := _ref_cycle(schema)):
        problem = f"recursive schemas are not supported ('$ref' {cycle!r} refers back to itself)"
    return problem


def _ref_cycle(schema: Mapping[str, Any]) -> str:
    """A ``$ref`` (local JSON pointer) that a path through ``schema`` reaches again from
    inside its own target ("" when none does). Definitions are walked only where referred to."""
    done: set[str] = set()
    on_path: set[str] = set()

    def visit(pointer: str) -> str:
        if pointer in on_path:
            return pointer
        if pointer in done:
            return ""
        target = _resolve(schema, pointer)
        if target is None:  # not a local pointer llguidance resolved: nothing to follow
            return ""
        on_path.add(pointer)
        for ref in _refs(target):
            if found := visit(ref):
                return found
        on_path.discard(pointer)
        done.add(pointer)
        return ""

    return visit("#")


def _refs(node: Any) -> Iterator[str]:
    """The ``$ref`` strings in ``node``, not descending into definitions (reached by reference)."""
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for key, value in node.items():
            if key not in ("$defs", "definitions"):
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _resolve(schema: Mapping[str, Any], pointer: str) -> Any:
    if pointer != "#" and not pointer.startswith("#/"):
        return None
    node: Any = schema
    for part in pointer[2:].split("/") if pointer != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
