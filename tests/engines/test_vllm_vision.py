"""A user turn's images reach vLLM as OpenAI ``image_url`` parts (docs/video.md#the-llm-stage):
the vLLM engine sends them as they are, before the turn's text, to a server that answers as
vLLM's OpenAI API does (``/v1/models``, streamed ``/v1/chat/completions``) on 127.0.0.1; with
``http.vllm.vision`` the cascade's capabilities say it can see."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.values import ChatMessage, SamplingParams
from rtserve.engines.vllm_engine import VllmTextEngine

FRAME = "data:image/jpeg;base64,/9j/AAAA"


def _vllm_api(bodies: list[dict[str, Any]]) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "vlm", "max_model_len": 4096}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in (
            {"choices": [{"index": 0, "delta": {"content": "a red square"}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        ):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@contextlib.asynccontextmanager
async def _serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_images_go_to_vllm_as_image_url_parts(config: ServerConfig) -> None:
    bodies: list[dict[str, Any]] = []
    async with _serving(_vllm_api(bodies)) as base:
        config.http.vllm.url, config.http.vllm.model, config.http.vllm.vision = base, "vlm", True
        engine = VllmTextEngine(config.http.vllm)
        await engine.start()
        messages = [ChatMessage("system", "be brief"), ChatMessage("user", "what is this", images=(FRAME, FRAME))]
        text = "".join([d.text async for d in engine.generate(messages, SamplingParams(max_tokens=8))])
    assert text == "a red square"
    assert bodies[0]["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": FRAME}},
                {"type": "image_url", "image_url": {"url": FRAME}},
                {"type": "text", "text": "what is this"},
            ],
        },
    ]


def test_the_cascade_sees_only_with_a_vision_llm(config: ServerConfig) -> None:
    assert CascadeEngine(config, CollectorRegistry()).capabilities.supports_vision is False
    config.cascade.llm_engine = "vllm"
    config.http.vllm.url, config.http.vllm.model = "http://127.0.0.1:9", "vlm"
    assert CascadeEngine(config, CollectorRegistry()).capabilities.supports_vision is False
    config.http.vllm.vision = True
    assert CascadeEngine(config, CollectorRegistry()).capabilities.supports_vision is True
