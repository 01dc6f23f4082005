"""/v1/chat/completions (+ SSE) and /v1/chat/completions/batch over a real socket, with the
official OpenAI SDK and raw aiohttp, against a test-double LLM."""

from __future__ import annotations

import asyncio
import functools
import json

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.web.http_support import sdk, serve_doubles

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


async def test_sdk_non_streaming_completion(config):
    async with serve_doubles(config) as (base, _engine):
        completion = await asyncio.to_thread(
            functools.partial(sdk(base).chat.completions.create, model="double-llm", messages=HELLO)
        )
    assert completion.object == "chat.completion"
    assert completion.model == "double-llm"
    assert completion.id.startswith("chatcmpl-")
    [choice] = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == "echo: hello there"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        2,
        3,
        5,
    )


async def test_sdk_streaming_with_usage(config):
    def consume(base: str) -> list:
        stream = sdk(base).chat.completions.create(
            model="double-llm", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        return list(stream)

    async with serve_doubles(config) as (base, _):
        chunks = await asyncio.to_thread(consume, base)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: hello there"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


async def test_raw_stream_frames_and_done_marker(config):
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json={"messages": HELLO, "stream": True}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            body = (await resp.read()).decode()
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert all("usage" not in p for p in payloads)  # only with stream_options.include_usage
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"


async def test_sampling_parameters_reach_the_engine(config):
    async with serve_doubles(config) as (base, engine):
        await asyncio.to_thread(
            functools.partial(
                sdk(base).chat.completions.create,
                model="double-llm",
                temperature=0.2,
                top_p=0.5,
                seed=7,
                stop=["END"],
                max_tokens=9,
                messages=[
                    {"role": "developer", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]},
                ],
            )
        )
    [(messages, params)] = engine.llm.seen
    assert [(m.role, m.content) for m in messages] == [("system", "be brief"), ("user", "two parts")]
    assert (params.temperature, params.top_p, params.seed, params.stop, params.max_tokens) == (0.2, 0.5, 7, ("END",), 9)


async def test_max_tokens_truncates_with_length(config):
    async with serve_doubles(config) as (base, _):
        completion = await asyncio.to_thread(
            functools.partial(
                sdk(base).chat.completions.create,
                model="double-llm",
                max_tokens=2,
                messages=[{"role": "user", "content": "one two three four"}],
            )
        )
    assert completion.choices[0].message.content == "echo: one"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 2


async def test_unknown_model_is_404_model_not_found(config):
    async with serve_doubles(config) as (base, _):
        with pytest.raises(openai.NotFoundError) as err:
            await asyncio.to_thread(functools.partial(sdk(base).chat.completions.create, model="gpt-9", messages=HELLO))
    assert err.value.status_code == 404
    assert isinstance(err.value.body, dict)
    assert err.value.body["code"] == "model_not_found"
    assert err.value.body["param"] == "model"


@pytest.mark.parametrize(
    ("patch", "param", "fragment"),
    [
        ({"temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_p": 1.01}, "top_p", "less than or equal to 1"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": 10**6}, "max_tokens", "less than or equal to 4096"),
        ({"max_completion_tokens": 10**6}, "max_completion_tokens", "less than or equal to 4096"),
        ({"n": 2}, "n", "only n=1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
            "tools[0].parameters",
            "Invalid schema for function 'f'",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
            "not in tools",
        ),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type", "Input should be 'function'"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "Input should be"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "Missing required parameter"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
            "does not match any of the expected tags: 'text', 'input_audio'",
        ),
        ({"stream": "sometimes"}, "stream", "valid boolean"),
    ],
)
async def test_invalid_parameters_are_400_naming_the_param(config, patch, param, fragment):
    body = {"model": "double-llm", "messages": HELLO, **patch}
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
            error = (await resp.json())["error"]
            assert resp.status == 400
    assert error["param"] == param
    assert fragment in error["message"]
    assert error["type"] == "invalid_request_error"
    assert engine.llm.control.calls == 0


@pytest.mark.parametrize(("raw", "fragment"), [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object")])
async def test_malformed_bodies_are_400(config, raw, fragment):
    async with (
        serve_doubles(config) as (base, _),
        aiohttp.ClientSession() as http,
        http.post(f"{base}/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert fragment in error["message"]
    assert error["code"] == "invalid_json"


async def test_engine_failure_mid_stream_is_an_sse_error_the_sdk_raises(config):
    def consume(base: str) -> list[str]:
        got = []
        for chunk in sdk(base).chat.completions.create(model="double-llm", messages=HELLO, stream=True):
            got.append(chunk.choices[0].delta.content or "")
        return got

    async with serve_doubles(config) as (base, engine):
        engine.llm.control.fail_after = 2
        with pytest.raises(openai.APIError, match="failed on purpose"):
            await asyncio.to_thread(consume, base)


async def test_engine_refusal_before_output_keeps_its_status(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.llm.control.fail_after = 0
        engine.llm.control.fail_code = "resource_exhausted"
        for stream in (False, True):
            async with http.post(f"{base}/v1/chat/completions", json={"messages": HELLO, "stream": stream}) as resp:
                assert resp.status == 429
                assert (await resp.json())["error"]["code"] == "resource_exhausted"


async def test_batch_answers_each_conversation_in_input_order(config):
    conversations = [[{"role": "user", "content": f"number {i}"}] for i in range(5)]
    async with (
        serve_doubles(config) as (base, engine),
        aiohttp.ClientSession() as http,
        http.post(
            f"{base}/v1/chat/completions/batch",
            json={"model": "double-llm", "messages": conversations, "max_tokens": 16},
        ) as resp,
    ):
        assert resp.status == 200
        body = await resp.json()
    assert [c["index"] for c in body["choices"]] == list(range(5))
    assert [c["message"]["content"] for c in body["choices"]] == [f"echo: number {i}" for i in range(5)]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 15, "total_tokens": 25}
    assert engine.llm.control.calls == 5


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"stream": True}, "stream"),
        ({"n": 3}, "n"),
        ({"messages": [[{"role": "user", "content": "ok"}], []]}, "messages[1]"),
        ({"messages": [{"role": "user", "content": "not a list of conversations"}]}, "messages[0]"),
        ({"messages": [[{"role": "user", "content": "x"}]] * 33}, "messages"),
    ],
)
async def test_batch_rejects_what_it_does_not_support(config, patch, param):
    body = {"messages": [[{"role": "user", "content": "ok"}]], **patch}
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions/batch", json=body) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == param
    assert engine.llm.control.calls == 0


async def test_batch_failure_of_one_conversation_fails_the_batch_and_stops_the_rest(config):
    conversations = [[{"role": "user", "content": "a b c d e f"}] for _ in range(3)]
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.llm.control.fail_after = 3
        async with http.post(f"{base}/v1/chat/completions/batch", json={"messages": conversations}) as resp:
            assert resp.status == 500
            assert (await resp.json())["error"]["message"] == "the double failed on purpose"
        assert engine.llm.control.closed.is_set()


async def test_tokenize_on_an_llm_that_cannot_count_says_so(config):
    """The double counts no tokens: POST /tokenize answers 501 ``tokenize_unsupported``
    (docs/serving.md#tokenize), and /v1/models lists it without ``max_model_len``."""
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/tokenize", json={"messages": HELLO}) as resp:
            assert resp.status == 501 and (await resp.json())["error"]["code"] == "tokenize_unsupported"
        async with http.get(f"{base}/v1/models") as resp:
            assert all("max_model_len" not in m for m in (await resp.json())["data"])
