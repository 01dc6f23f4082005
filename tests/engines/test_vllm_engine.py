"""The vLLM engine where no vLLM runs: selecting it without its server's address or model is a
startup error naming the field; a server that never answers makes it unavailable (typed,
saying where it looked) instead of hanging, and /health says so. Against a real vLLM:
``tests/vllm_lane``."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Literal

import aiohttp
import pytest
from aiohttp import web

from rtserve.app import build_app
from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams
from rtserve.engines.vllm_engine import VllmTextEngine
from tests.support import serve_app, serve_plain
from tests.web.http_support import TurnEnginesSessionDouble


@pytest.mark.parametrize("missing", ["url", "model"])
@pytest.mark.parametrize("selected", ["text_engine", "llm_engine"])
def test_selecting_vllm_without_its_server_fails_at_startup(config: ServerConfig, missing: str, selected: str) -> None:
    config.http.vllm.url, config.http.vllm.model = "http://127.0.0.1:8000", "m"
    setattr(config.http.vllm, missing, None)
    build: Callable[[], object]
    if selected == "text_engine":
        config.http.text_engine = "vllm"
        build = lambda: build_app(config, engine=TurnEnginesSessionDouble())  # noqa: E731
    else:
        from prometheus_client import CollectorRegistry

        from rtserve.engines.cascade import CascadeEngine

        config.cascade.llm_engine = "vllm"
        build = lambda: CascadeEngine(config, CollectorRegistry())  # noqa: E731
    with pytest.raises(ConfigError, match=rf"'http\.vllm\.{missing}': required when vLLM serves the LLM"):
        build()


async def test_a_server_that_never_answers_leaves_the_engine_unavailable(config: ServerConfig) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config.http.vllm.url, config.http.vllm.model = f"http://127.0.0.1:{port}", "m"
    config.http.vllm.startup_timeout_s = 0.01
    engine = VllmTextEngine(config.http.vllm)
    messages = [ChatMessage(role="user", content="hi")]
    with pytest.raises(EngineError) as loading:
        await anext(engine.generate(messages, SamplingParams()))
    assert loading.value.code == "model_not_ready"

    with pytest.raises(EngineError) as failed:
        await engine.start()
    assert failed.value.code == "model_unavailable"
    assert f"127.0.0.1:{port}" in failed.value.message and "startup_timeout_s" in failed.value.message
    with pytest.raises(EngineError) as refused:
        await anext(engine.generate(messages, SamplingParams()))
    assert refused.value.code == "model_unavailable" and "127.0.0.1" not in refused.value.message  # no internals


async def test_health_waits_for_the_vllm_server_and_says_when_it_failed(config: ServerConfig) -> None:
    """Chat on vLLM is part of what the server serves: /health is not ok before vLLM is."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config.engine = "loopback"
    config.http.text_engine = "vllm"
    config.http.vllm.url, config.http.vllm.model = f"http://127.0.0.1:{port}", "m"
    config.http.vllm.startup_timeout_s = 0.5
    seen = []
    async with serve_app(build_app(config)) as base, aiohttp.ClientSession() as http:
        for _ in range(200):  # the loopback engine is up at once; vLLM never answers
            async with http.get(f"{base}/health") as response:
                seen.append((response.status, (await response.json())["status"]))
            if seen[-1][1] == "failed":
                break
            await asyncio.sleep(0.05)
    assert set(seen) == {(503, "starting"), (503, "failed")} or set(seen) == {(503, "failed")}
    assert seen[-1] == (503, "failed")


async def test_a_busy_llm_server_is_a_capacity_error(config: ServerConfig) -> None:
    """An rtserve serving as the LLM answers 429 past transport.max_concurrent_http_generations:
    the reply fails ``resource_exhausted`` (retry later), not ``model_unavailable``."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def busy(_: web.Request) -> web.Response:
        body = {
            "error": {
                "message": "Too many concurrent generations (limit 8); retry shortly.",
                "code": "rate_limit_exceeded",
            }
        }
        return web.json_response(body, status=429, headers={"Retry-After": "1"})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", busy)
    async with serve_plain(app) as url:
        config.http.vllm.url, config.http.vllm.model = url, "m"
        engine = VllmTextEngine(config.http.vllm)
        await engine.start()
        with pytest.raises(EngineError) as refused:
            await anext(engine.generate([ChatMessage(role="user", content="hi")], SamplingParams()))
    assert refused.value.code == "resource_exhausted" and "busy" in refused.value.message


@pytest.mark.parametrize(
    ("engine", "llm_engine", "says"),
    [("cascade", "embedded", "serves chat with already"), ("loopback", "vllm", "cascade.llm_engine is 'vllm'")],
)
def test_an_embedded_text_engine_beside_the_cascade_or_vllm_is_refused_at_startup(
    config: ServerConfig, engine: str, llm_engine: Literal["embedded", "vllm"], says: str
) -> None:
    """``http.text_engine: embedded`` loads the cascade's LLM alone (an LLM server): beside the
    cascade engine it would be a second copy, with ``cascade.llm_engine: vllm`` there is none to load."""
    config.engine, config.http.text_engine, config.cascade.llm_engine = engine, "embedded", llm_engine
    config.http.vllm.url, config.http.vllm.model = "http://127.0.0.1:8000", "m"
    with pytest.raises(ConfigError, match=rf"'http\.text_engine': .*{says}"):
        build_app(config)


async def test_a_voice_turn_that_surely_fits_is_sent_without_a_count(config: ServerConfig) -> None:
    """``fit_history`` counts with ``/tokenize`` only a conversation whose bytes could outgrow the
    context (no token holds less than a byte): a short voice turn costs the server one request, not
    two, and a long one is still counted and fitted."""
    counted: list[int] = []

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 2048}]})

    async def tokenize(request: web.Request) -> web.Response:
        turns = len((await request.json())["messages"])
        counted.append(turns)
        return web.json_response({"count": 400 * turns, "tokens": [], "max_model_len": 2048})

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in (
            {"choices": [{"delta": {"content": "Paris."}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
        ):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", completions)
    params = SamplingParams(max_tokens=256)
    short = [ChatMessage("system", "Be brief."), ChatMessage("user", "What is the capital of France?")]
    long = [*(ChatMessage("user", "tell me more " * 100) for _ in range(4)), short[-1]]
    async with serve_plain(app) as url:
        config.http.vllm.url, config.http.vllm.model = url, "m"
        engine = VllmTextEngine(config.http.vllm)
        await engine.start()
        assert "".join([d.text async for d in engine.generate(short, params, fit_history=True)]) == "Paris."
        assert counted == []
        assert "".join([d.text async for d in engine.generate(long, params, fit_history=True)]) == "Paris."
    assert counted and counted[-1] < len(long)  # counted, and the oldest turns dropped to fit
