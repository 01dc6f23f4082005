"""Function calling end to end with the official ``openai`` SDK over real sockets.

Without models: the realtime session refuses tools it cannot serve with typed errors (every
event validated by the SDK's types) and keeps function items; chat completions carries
tools, assistant ``tool_calls`` and ``tool`` messages to the engine.
With the real SmolLM2-135M (``models``): a forced call's arguments parse and validate against
the tool's JSON schema (realtime and both chat forms), and the call's result continues the
conversation.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jsonschema
import openai
import pytest
import pytest_asyncio
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageFunctionToolCall
from openai.types.realtime import (
    RealtimeFunctionToolParam,
    RealtimeResponseCreateParamsParam,
    RealtimeSessionCreateRequestParam,
)

from rtserve.config import load_config
from tests.web.http_support import sdk, serve_doubles
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import loopback_config, receive_event, running, ws_url

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
REALTIME_TOOL: RealtimeFunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": WEATHER_SCHEMA,
}
CHAT_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": REALTIME_TOOL["name"],
        "description": REALTIME_TOOL["description"],
        "parameters": WEATHER_SCHEMA,
    },
}
QUESTION = "What is the weather in Paris?"
LOAD_TIMEOUT_S = 300
MODEL_EVENT_TIMEOUT_S = 120  # real models on a loaded 2-core CPU: only a hung test should hit it


def realtime_sdk(base: str, timeout: float = 15) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=timeout)


# ---------------------------------------------------------------------------
# Without models
# ---------------------------------------------------------------------------


async def test_realtime_refuses_tools_it_cannot_serve(config) -> None:
    async with running(loopback_config(config)) as base:
        async with realtime_sdk(base).realtime.connect(model="loopback") as conn:
            reader = SdkReader(conn)
            await reader.until("session.created")
            bad_schema: RealtimeFunctionToolParam = {
                **REALTIME_TOOL,
                "parameters": {"type": "object", "required": "city"},
            }
            refusals: list[tuple[dict[str, Any], str, str]] = [
                ({"tools": [bad_schema]}, "session.tools[0].parameters", "Invalid schema for function 'get_weather'"),
                (
                    {"tools": [REALTIME_TOOL], "tool_choice": {"type": "function", "name": "get_time"}},
                    "session.tool_choice",
                    "not in tools",
                ),
                (
                    {"tools": [{"type": "mcp", "server_label": "x", "name": "m"}]},
                    "session.tools[0].type",
                    "not supported",
                ),
                ({"tools": [], "tool_choice": "required"}, "session.tool_choice", "no tools"),
                # Valid tools on an engine that cannot call them: refused, not kept and ignored.
                ({"tools": [REALTIME_TOOL]}, "session.tools", "loopback engine cannot call functions"),
            ]
            for i, (change, param, fragment) in enumerate(refusals):
                await conn.session.update(
                    session={"type": "realtime", **change},  # type: ignore[arg-type]  # refused changes, the mcp tool outside the SDK's types
                    event_id=f"bad-{i}",
                )
                error = (await reader.until("error"))["error"]
                assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", param, f"bad-{i}")
                assert fragment in error["message"]

            # The same checks hold for a response's own tools and tool_choice.
            response_refusals: list[tuple[RealtimeResponseCreateParamsParam, str, str]] = [
                ({"tools": [bad_schema]}, "response.tools[0].parameters", "Invalid schema"),
                ({"tool_choice": {"type": "function", "name": "get_time"}}, "response.tool_choice", "not in tools"),
                ({"tools": [REALTIME_TOOL]}, "response.tools", "loopback engine cannot call functions"),
            ]
            for i, (response_change, param, fragment) in enumerate(response_refusals):
                await conn.response.create(response=response_change, event_id=f"bad-response-{i}")
                error = (await reader.until("error"))["error"]
                assert (error["code"], error["param"], error["event_id"]) == (
                    "invalid_value",
                    param,
                    f"bad-response-{i}",
                )
                assert fragment in error["message"]

            # A result for a call nobody made is refused; a restored call and its result are kept.
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": "call_nope", "output": "{}"}, event_id="orphan"
            )
            error = (await reader.until("error"))["error"]
            assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "item.call_id", "orphan")
            await conn.conversation.item.create(
                item={
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city":"Oslo"}',
                }
            )
            added = (await reader.until("conversation.item.added"))["item"]
            assert (added["type"], added["call_id"], added["arguments"]) == (
                "function_call",
                "call_1",
                '{"city":"Oslo"}',
            )
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 3}'}
            )
            added = (await reader.until("conversation.item.added"))["item"]
            assert (added["type"], added["call_id"], added["output"]) == (
                "function_call_output",
                "call_1",
                '{"temp": 3}',
            )
            await conn.session.update(session={"type": "realtime", "instructions": "still usable"})
            assert (await reader.until("session.updated"))["session"]["tools"] == []


async def test_a_duplex_session_opened_with_tools_on_an_engine_without_them_is_refused(config) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1", autostart="0")) as ws:
            await ws.send_json({"type": "session.update", "event_id": "open", "session": {"tools": [REALTIME_TOOL]}})
            event = await receive_event(ws)
            assert event is not None
            error = event["error"]
            assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "session.tools", "open")
            await ws.send_json({"type": "session.update", "session": {"instructions": "no tools then"}})
            assert (await receive_event(ws) or {}).get("type") == "session.created"


async def test_chat_tools_and_tool_messages_reach_the_engine(config) -> None:
    async with serve_doubles(config) as (base, engine):
        await asyncio.to_thread(
            functools.partial(
                sdk(base).chat.completions.create,
                model="double-llm",
                tools=[CHAT_TOOL],
                tool_choice="required",
                messages=[
                    {"role": "user", "content": QUESTION},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
                ],
            )
        )
    [(messages, params)] = engine.llm.seen
    assert [(t.name, dict(t.parameters)) for t in params.tools] == [("get_weather", WEATHER_SCHEMA)]
    assert (params.tool_choice.mode, params.tool_choice.name) == ("required", None)
    call = messages[1].tool_calls[0]
    assert (messages[1].role, call.call_id, call.name, json.loads(call.arguments)) == (
        "assistant",
        "call_1",
        "get_weather",
        {"city": "Paris", "unit": "celsius"},
    )
    assert (messages[2].role, messages[2].tool_call_id, messages[2].content) == ("tool", "call_1", "21 degrees")


async def test_chat_refuses_a_forced_tool_that_is_not_offered(config) -> None:
    async with serve_doubles(config) as (base, engine):
        with pytest.raises(openai.BadRequestError) as err:
            await asyncio.to_thread(
                functools.partial(
                    sdk(base).chat.completions.create,
                    model="double-llm",
                    tools=[CHAT_TOOL],
                    tool_choice={"type": "function", "function": {"name": "get_time"}},
                    messages=[{"role": "user", "content": QUESTION}],
                )
            )
    assert isinstance(err.value.body, dict)
    assert (err.value.body["code"], err.value.body["param"]) == ("invalid_value", "tool_choice")
    assert engine.llm.control.calls == 0


# ---------------------------------------------------------------------------
# With the real SmolLM2-135M
# ---------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def base() -> AsyncIterator[str]:
    async with running(load_config(environ={}), ready_timeout_s=LOAD_TIMEOUT_S) as url:
        yield url


def answers_in_words(answer: str) -> bool:
    """A words answer with no call syntax in it. Whether SmolLM2-135M quotes the result (21 degrees,
    sunny) is the model's business, not the server's: it is not asked for."""
    return bool(answer.strip()) and "<tool" not in answer and "{" not in answer


def weather_arguments(arguments: str) -> dict[str, Any]:
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, WEATHER_SCHEMA)
    return parsed


@pytest.mark.models
@pytest.mark.asyncio(loop_scope="module")
async def test_chat_forced_call_then_its_result_continues_the_conversation(base) -> None:
    client = sdk(base)
    asked = [{"role": "user", "content": QUESTION}]
    completion = await asyncio.to_thread(
        functools.partial(
            client.chat.completions.create,
            model="smollm2-135m-instruct",
            messages=asked,
            tools=[CHAT_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=0,
            max_tokens=60,
        )
    )
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    weather_arguments(call.function.arguments)

    def stream(messages: list[Any], **kwargs: Any) -> list[Any]:
        return list(
            client.chat.completions.create(
                model="smollm2-135m-instruct",
                messages=messages,
                stream=True,
                tools=[CHAT_TOOL],
                temperature=0,
                max_tokens=60,
                **kwargs,
            )
        )

    chunks = await asyncio.to_thread(stream, asked, tool_choice="required")
    pieces = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(pieces) > 1 and pieces[0].id and pieces[0].function.name == "get_weather"
    assert all(p.id is None and p.function.name is None for p in pieces[1:])
    weather_arguments("".join(p.function.arguments for p in pieces))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # The result goes back as a tool message; with the tools still offered ("auto") the model
    # answers in words, and nothing of the call convention reaches the client as text.
    answered = [
        *asked,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    chunks = await asyncio.to_thread(stream, answered)
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert answers_in_words(answer)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


@pytest.mark.models
@pytest.mark.asyncio(loop_scope="module")
async def test_realtime_forced_call_output_and_next_response(base) -> None:
    async with realtime_sdk(base, MODEL_EVENT_TIMEOUT_S).realtime.connect(model="cascade") as conn:
        reader = SdkReader(conn, timeout_s=MODEL_EVENT_TIMEOUT_S)
        await reader.until("session.created")
        session_update: RealtimeSessionCreateRequestParam = {
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
            "tools": [REALTIME_TOOL],
            "tool_choice": "required",
            "max_output_tokens": 60,
            "temperature": 0,  # type: ignore[typeddict-unknown-key]  # rtserve's session temperature, not in the SDK's GA type
        }
        await conn.session.update(session=session_update)
        session = (await reader.until("session.updated"))["session"]
        assert (session["tools"], session["tool_choice"]) == ([REALTIME_TOOL], "required")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
        )
        await conn.response.create()
        start = len(reader.events)
        done = (await reader.until("response.done"))["response"]
        events = reader.events[start:]

        assert done["status"] == "completed"
        call = next(item for item in done["output"] if item["type"] == "function_call")
        assert call["name"] == "get_weather" and call["status"] == "completed"
        arguments = weather_arguments(call["arguments"])
        added = next(
            e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
        )
        assert (added["item"]["call_id"], added["item"]["name"]) == (call["call_id"], "get_weather")
        deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
        [args_done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert "".join(deltas) == args_done["arguments"] == call["arguments"]
        assert args_done["call_id"] == call["call_id"] and args_done["item_id"] == call["id"]
        assert any(e["type"] == "response.output_item.done" and e["item"]["id"] == call["id"] for e in events)

        # The client runs the function and hands back its result; the next response uses it.
        await conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": json.dumps({"city": arguments["city"], "temperature": 21, "sky": "sunny"}),
            }
        )
        assert (await reader.until("conversation.item.done"))["item"]["type"] == "function_call_output"
        await conn.session.update(
            session={"type": "realtime", "tool_choice": {"type": "function", "name": "get_weather"}}
        )
        assert (await reader.until("session.updated"))["session"]["tool_choice"] == {
            "type": "function",
            "name": "get_weather",
        }
        # The session still forces the call; this response's own tool_choice lets it answer.
        await conn.response.create(response={"tool_choice": "auto"})
        start = len(reader.events)
        done = (await reader.until("response.done"))["response"]
        answered = reader.events[start:]

        # A voice response that calls speaks nothing: the call is not read out.
        await conn.response.create(response={"output_modalities": ["audio"]})
        start = len(reader.events)
        spoken = (await reader.until("response.done"))["response"]
    assert done["status"] == "completed"
    [message] = done["output"]
    answer = message["content"][0]["text"]
    assert message["type"] == "message" and answers_in_words(answer)
    assert not any(e["type"].startswith("response.function_call") for e in answered)
    assert spoken["status"] == "completed"
    assert [item["type"] for item in spoken["output"]] == ["message", "function_call"]
    assert spoken["output"][0]["content"][0] == {"type": "output_audio", "transcript": ""}
    assert not any(e["type"] == "response.output_audio.delta" for e in reader.events[start:])
