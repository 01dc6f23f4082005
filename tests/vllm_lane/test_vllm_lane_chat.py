"""``/v1/chat/completions`` through rtserve with ``http.text_engine: vllm``, against a real
vLLM server on CPU (``conftest.vllm_server``) serving SmolLM2-135M-Instruct, driven by the
official ``openai`` SDK: plain and streamed replies, concurrent requests (batched: vLLM's
step counter says so), forced function calls decoded by vLLM under the tool's schema, a
call's result continuing the conversation, vLLM's refusals as typed errors. The session engine is
``loopback``, which has no LLM: every answer here comes from vLLM."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jsonschema
import openai
import pytest
import pytest_asyncio
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction

from rtserve.config import ServerConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams
from rtserve.engines.vllm_engine import VllmTextEngine
from tests.vllm_lane.vllm_lane_support import VllmServer, vllm_metrics
from tests.web.http.test_function_calling import CHAT_TOOL, QUESTION, WEATHER_SCHEMA
from tests.web.realtime_support import running

pytestmark = pytest.mark.slow

CAPITAL: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]
TIME_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TIME_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "get_time", "description": "Get the current time in a time zone", "parameters": TIME_SCHEMA},
}
READY_TIMEOUT_S = 120  # the app waits for vLLM's /v1/models (vLLM is already up)


def _usage(reply: ChatCompletion | ChatCompletionChunk) -> CompletionUsage:
    """A reply's token counts (vLLM reports them on every reply, and on a stream's last chunk)."""
    assert reply.usage is not None
    return reply.usage


def _function(call: ChoiceDeltaToolCall) -> ChoiceDeltaToolCallFunction:
    """A streamed tool call piece's function part (every piece carries one)."""
    assert call.function is not None
    return call.function


@pytest_asyncio.fixture
async def client(vllm_config: ServerConfig) -> AsyncIterator[openai.AsyncOpenAI]:
    vllm_config.engine = "loopback"
    async with running(vllm_config, ready_timeout_s=READY_TIMEOUT_S) as base:
        yield openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=300, max_retries=0)


async def test_plain_reply_with_usage(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="smollm2-135m-instruct", messages=CAPITAL, temperature=0, max_tokens=24
    )
    choice = reply.choices[0]
    assert choice.message.content is not None
    assert choice.message.content.strip()  # an answer (what SmolLM2-135M knows is not tested)
    assert choice.finish_reason == "stop" or _usage(reply).completion_tokens == 24
    assert reply.model == "smollm2-135m-instruct"
    assert _usage(reply).prompt_tokens > 10 and 0 < _usage(reply).completion_tokens <= 24


async def test_streamed_reply_arrives_in_pieces_then_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="gpt-4o",
        messages=CAPITAL,
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2 and "".join(pieces).strip()
    [finish] = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == "stop" or _usage(chunks[-1]).completion_tokens == 24
    assert 0 < _usage(chunks[-1]).completion_tokens <= 24 and _usage(chunks[-1]).prompt_tokens > 10


async def test_concurrent_requests_are_batched_and_all_answered(
    client: openai.AsyncOpenAI, vllm_server: VllmServer
) -> None:
    before = await vllm_metrics(vllm_server)
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="smollm2-135m-instruct", messages=CAPITAL, temperature=0, max_tokens=24
            )
            for _ in range(8)
        )
    )
    after = await vllm_metrics(vllm_server)
    assert all((r.choices[0].message.content or "").strip() for r in replies)
    assert len({r.id for r in replies}) == 8
    # One request at a time, every engine step would yield at most one token: fewer steps than
    # tokens means steps that decoded several requests at once.
    steps = after["vllm:iteration_tokens_total_count"] - before["vllm:iteration_tokens_total_count"]
    tokens = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert tokens == sum(_usage(r).completion_tokens for r in replies)
    assert steps < tokens


async def test_batch_route_answers_each_conversation(vllm_config: ServerConfig) -> None:
    vllm_config.engine = "loopback"
    async with running(vllm_config, ready_timeout_s=READY_TIMEOUT_S) as base, aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/chat/completions/batch",
            json={
                "model": "smollm2-135m-instruct",
                "temperature": 0,
                "max_tokens": 24,
                "messages": [CAPITAL, [{"role": "user", "content": "Say hello."}], CAPITAL],
            },
        ) as response:
            body = await response.json()
    assert response.status == 200, body
    texts = [c["message"]["content"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(t.strip() for t in texts) and texts[1] != texts[0]  # each conversation its own answer, in order


async def test_forced_function_call_has_arguments_following_the_schema(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=200,
        tools=[CHAT_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


async def test_required_call_streams_and_names_one_of_the_tools(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=200,
        tools=[CHAT_TOOL, TIME_TOOL],
        tool_choice="required",
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    names = [_function(c).name for c in calls if _function(c).name]
    arguments = json.loads("".join(_function(c).arguments or "" for c in calls))
    assert len(names) == 1 and {c.index for c in calls} == {0}
    schema = WEATHER_SCHEMA if names[0] == "get_weather" else TIME_SCHEMA
    jsonschema.validate(arguments, schema)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_call_result_continues_the_conversation(client: openai.AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees celsius"},
    ]
    reply = await client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, temperature=0, max_tokens=32, tools=[CHAT_TOOL]
    )
    choice = reply.choices[0]
    assert choice.message.content and not choice.message.tool_calls


async def test_prompt_over_vllms_context_is_a_typed_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="smollm2-135m-instruct", max_tokens=8, messages=[{"role": "user", "content": "hello " * 3000}]
        )
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "context_length_exceeded"
    assert "maximum context length is 2048" in refused.value.body["message"]


async def test_voice_history_is_fitted_to_vllms_context(vllm_config: ServerConfig) -> None:
    """What a voice session asks (``fit_history``): a conversation past the context loses its
    oldest turns, as few as fit (the prompt lands within one ~150-token turn of the budget),
    and is answered."""
    engine = VllmTextEngine(vllm_config.http.vllm)
    await engine.start()
    filler = " ".join(["weather"] * 150)
    old = [ChatMessage(role=role, content=f"{i} {filler}") for i in range(30) for role in ("user", "assistant")]
    messages = [
        ChatMessage(role="system", content="You are brief."),
        *old,
        ChatMessage(role="user", content="What is the capital of France?"),
    ]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    with pytest.raises(EngineError) as refused:
        await anext(engine.generate(messages, params))
    assert refused.value.code == "context_length_exceeded"

    deltas = [d async for d in engine.generate(messages, params, fit_history=True)]
    assert "".join(d.text for d in deltas) and deltas[-1].finish_reason in ("stop", "length")
    assert 2048 - 24 - 200 < deltas[-1].prompt_tokens <= 2048 - 24  # the most that fits: ~1 turn of ~150 short
