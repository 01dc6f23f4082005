"""An LLM server: ``--engine loopback`` with ``http.text_engine: embedded`` (the shipped SmolLM2-135M
alone), over a real socket (docs/serving.md#tokenize). ``POST /tokenize`` and ``max_model_len`` in
``/v1/models``: the counts are what a chat completion reports, options that would change them are
refused, and another rtserve's vLLM client (``cascade.llm_engine: vllm``) serves a long voice
conversation with this server as its LLM, as the default voice agent does a realtime one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp
import pytest
import pytest_asyncio

from rtserve.app import build_app
from rtserve.config import VllmSettings, load_config
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams
from rtserve.engines.vllm_engine import VllmTextEngine
from tests.support import serve_app
from tests.web.realtime_support import until_ready, ws_url

pytestmark = [pytest.mark.models, pytest.mark.asyncio(loop_scope="module")]

LLM = "smollm2-135m-instruct"
CONTEXT = 512  # cascade.llm_context_tokens here: a conversation outgrows it in a few turns
LOAD_TIMEOUT_S = 300
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def base() -> AsyncIterator[str]:
    config = load_config(
        environ={},
        overrides={
            "engine": "loopback",
            "http": {"text_engine": "embedded"},
            "cascade": {"llm_context_tokens": CONTEXT},
            "enable_sleep_mode": True,
        },
    )
    async with serve_app(build_app(config)) as url, aiohttp.ClientSession() as http:
        await until_ready(http, url, LOAD_TIMEOUT_S)
        yield url


async def _post(base: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(f"{base}{path}", json=body) as resp:
        return resp.status, await resp.json()


async def test_a_conversations_count_is_the_prompt_a_chat_completion_reports(base: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/models") as resp:
        listed = (await resp.json())["data"]
    assert [(m["id"], m["max_model_len"]) for m in listed if "max_model_len" in m] == [(LLM, CONTEXT)]
    assert len(listed) > 1  # the loopback engine's models, which are no LLM
    for tools in ([], [WEATHER]):
        status, counted = await _post(base, "/tokenize", {"model": LLM, "messages": QUESTION, "tools": tools})
        assert status == 200, counted
        completion = {"model": LLM, "messages": QUESTION, "max_tokens": 1, "tools": tools or None}
        status, answered = await _post(base, "/v1/chat/completions", completion)
        assert status == 200, answered
        assert counted["count"] == len(counted["tokens"]) == answered["usage"]["prompt_tokens"]
        assert counted["max_model_len"] == CONTEXT and counted["token_strs"] is None
    status, text = await _post(base, "/tokenize", {"prompt": "What is the capital of France?"})
    assert status == 200 and 0 < text["count"] == len(text["tokens"]) < counted["count"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": QUESTION, "chat_template": "{{ messages }}"}, "chat_template"),
        ({"messages": QUESTION, "add_generation_prompt": False}, "add_generation_prompt"),
        ({"messages": QUESTION, "continue_final_message": True}, "continue_final_message"),
        ({"messages": QUESTION, "return_token_strs": True}, "return_token_strs"),
        ({"prompt": "hi", "return_token_strs": True}, "return_token_strs"),
        ({"messages": []}, "messages"),
    ],
)
async def test_options_that_would_change_the_count_are_refused(base: str, body: dict[str, Any], param: str) -> None:
    status, refused = await _post(base, "/tokenize", body)
    assert status == 400 and refused["error"]["code"] == "invalid_value" and refused["error"]["param"] == param


async def test_a_prompt_far_past_the_context_is_refused_before_the_tokenizer(base: str) -> None:
    status, refused = await _post(base, "/tokenize", {"prompt": "word " * CONTEXT * 8})
    assert status == 400 and refused["error"]["code"] == "context_length_exceeded"
    status, refused = await _post(base, "/tokenize", {"model": "another-model", "messages": QUESTION})
    assert status == 404, refused


async def test_another_rtserve_keeps_a_long_voice_conversation_within_this_ones_context(base: str) -> None:
    """What a voice agent with ``cascade.llm_engine: vllm`` pointed here does each reply: its
    history outgrew the context, so it drops the oldest turns, counting with /tokenize."""
    llm = VllmTextEngine(VllmSettings(url=base, model=LLM, startup_timeout_s=30))
    await llm.start()
    assert await llm.context_tokens() == CONTEXT
    roles: list[Literal["user", "assistant"]] = ["user", "assistant"] * 8
    history = [
        ChatMessage(role, f"Turn {i}: " + "tell me more about the weather in Paris today " * 4)
        for i, role in enumerate(roles)
    ]
    conversation = [ChatMessage("system", "You are brief."), *history, ChatMessage("user", "And tomorrow?")]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    assert len(await llm.tokenize(conversation, params)) > CONTEXT
    with pytest.raises(EngineError) as refused:
        await anext(llm.generate(conversation, params))
    assert refused.value.code == "context_length_exceeded"
    deltas = [d async for d in llm.generate(conversation, params, fit_history=True)]
    assert deltas[-1].finish_reason in ("stop", "length")
    assert 0 < deltas[-1].prompt_tokens <= CONTEXT - params.max_tokens


async def test_a_voice_agent_answers_with_this_server_as_its_llm(base: str) -> None:
    """The whole composition: the default voice agent (cascade) with ``cascade.llm_engine: vllm``
    pointed at this LLM server answers a realtime conversation's question."""
    agent = load_config(
        environ={}, overrides={"cascade": {"llm_engine": "vllm"}, "http": {"vllm": {"url": base, "model": LLM}}}
    )
    async with serve_app(build_app(agent)) as url, aiohttp.ClientSession() as http:
        await until_ready(http, url, LOAD_TIMEOUT_S)
        async with http.ws_connect(ws_url(url)) as ws:
            assert (await ws.receive_json(timeout=30))["type"] == "session.created"
            user = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello, who are you?"}],
            }
            await ws.send_json({"type": "conversation.item.create", "item": user})
            await ws.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
            text: list[str] = []
            while (event := await ws.receive_json(timeout=60))["type"] != "response.done":
                if event["type"] == "response.output_text.delta":
                    text.append(event["delta"])
    assert event["response"]["status"] == "completed", event
    assert "".join(text).strip()  # what a 135M model says is its own


async def test_the_llm_sleeps_as_a_stage_of_its_own_and_serves_again_once_woken(base: str) -> None:
    """Last in the module (its server sleeps for a while): the embedded LLM is stage 0 beside the
    loopback engine, which has none; asleep, chat and counts are refused with a typed error while
    ``/health`` stays 200 (docs/serving.md#sleep-mode)."""
    status, body = await _post(base, "/v1/omni/sleep", {"level": 1})
    assert status == 200 and [a["stage"] for a in body["acks"]] == ["llm"] and body["sleeping_stages"] == [0], body
    for path, request in (
        ("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 4}),
        ("/tokenize", {"messages": QUESTION}),
    ):
        status, body = await _post(base, path, request)
        assert status == 503 and body["error"]["code"] == "engine_sleeping", (path, body)
    async with aiohttp.ClientSession() as http, http.get(f"{base}/health") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "sleeping"

    status, body = await _post(base, "/v1/omni/wakeup", {})
    assert status == 200 and body["stage_ids"] == [0] and body["sleeping_stages"] == [], body
    status, body = await _post(base, "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 8})
    assert status == 200 and body["choices"][0]["message"]["content"], body
