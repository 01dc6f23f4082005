"""The cascade's sessions hosted by a front-end worker (docs/engines.md#cascade-sessions-in-workers):
with the tiny Kyutai STT and TTS, a realtime session opened over a worker's engine link lives in the
worker (its VAD and reply chain there), while the engine process holds the models and only their
streams; ``cascade.sessions_in_workers: false`` keeps it in the engine process; a worker refuses new
sessions while a stage of the engine process sleeps; with the LLM on a vLLM server the worker asks it
itself, not through the engine process. The conversation itself (speech in, words,
reply audio, barge-in) over this path is ``test_realtime_gpu_agent_cpu.py`` under
``--engine-client=link``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve import app as app_module
from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.cascade.engine import CascadeEngine
from rtserve.engines.remote.client import RemoteLLM, RemoteSessionEngine
from rtserve.engines.remote.worker_cascade import WorkerCascade
from rtserve.errors import ENGINE_SLEEPING
from rtserve.web.context import CTX
from tests.engines.cascade.test_cascade_tts_server import until_served
from tests.engines.kyutai_tts.tiny import TinyTTS
from tests.support import serve_app, serve_plain
from tests.web.realtime.test_realtime_cascade import LOAD_TIMEOUT_S
from tests.web.realtime.test_realtime_cascade_kyutai_tts import tiny
from tests.web.realtime.test_realtime_stream_asr import stt_weights
from tests.web.realtime_support import until_ready, ws_url

pytestmark = pytest.mark.models

__all__ = ["stt_weights", "tiny"]


@pytest.fixture
def linked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apps built here reach their engines over the engine link, as a worker does."""
    monkeypatch.setattr(app_module, "engine_client", "link")


def _agent(config: ServerConfig, stt_weights: Path, tiny: TinyTTS, *, in_workers: bool) -> ServerConfig:
    return config.model_copy(
        update={
            "engine": "cascade",
            "enable_sleep_mode": True,
            "stt_engine": config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": 2}),
            "tts_engine": config.tts_engine.model_copy(
                update={"weights": str(tiny.folder), "voices": str(tiny.voices), "default_voice": "alice"}
            ),
            "cascade": config.cascade.model_copy(
                update={"asr": "stt_engine", "tts": "tts_engine", "sessions_in_workers": in_workers}
            ),
        }
    )


async def _first_event(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    event: dict[str, Any] = await ws.receive_json(timeout=30)
    return event


async def _until_sleeping(app: Any, stages: tuple[int, ...]) -> None:
    """Until the engine process's offer saying so reached the worker (bounded)."""
    for _ in range(200):
        if app[CTX].engines.sleeping == stages:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the worker never saw stages {stages} asleep")


@pytest.mark.parametrize("in_workers", [True, False])
async def test_the_session_lives_where_the_config_says(
    linked: None, config: ServerConfig, stt_weights: Path, tiny: TinyTTS, in_workers: bool
) -> None:
    agent = _agent(config, stt_weights, tiny, in_workers=in_workers)
    engine = CascadeEngine(agent, CollectorRegistry())  # what the engine process runs
    app = build_app(agent, engine=engine)
    worker = app[CTX].engines.session_engine
    assert isinstance(worker, WorkerCascade if in_workers else RemoteSessionEngine)
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        await until_ready(http, base, LOAD_TIMEOUT_S)
        async with http.ws_connect(ws_url(base, model="cascade")) as ws:
            assert (await _first_event(ws))["type"] == "session.created"
            if isinstance(worker, WorkerCascade):
                assert (worker.session_count, engine.session_count) == (1, 0)
            else:
                assert engine.session_count == 1


async def test_a_worker_refuses_new_sessions_while_a_stage_sleeps(
    linked: None, config: ServerConfig, stt_weights: Path, tiny: TinyTTS
) -> None:
    app = build_app(_agent(config, stt_weights, tiny, in_workers=True))
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        await until_ready(http, base, LOAD_TIMEOUT_S)
        async with http.post(f"{base}/v1/omni/sleep", json={"stage_ids": [3]}) as resp:
            assert resp.status == 200 and (await resp.json())["acks"][0]["stage"] == "tts_engine"
        await _until_sleeping(app, (3,))
        async with http.ws_connect(ws_url(base, model="cascade")) as ws:
            event = await _first_event(ws)
        assert event["type"] == "error" and event["error"]["code"] == ENGINE_SLEEPING, event
        async with http.post(f"{base}/v1/omni/wakeup", json={"stage_ids": [3]}) as resp:
            assert resp.status == 200 and (await resp.json())["sleeping_stages"] == []
        await _until_sleeping(app, ())
        async with http.ws_connect(ws_url(base, model="cascade")) as ws:
            assert (await _first_event(ws))["type"] == "session.created"


async def _fake_vllm(answer: str, asked: list[dict[str, Any]]) -> AsyncGenerator[str, None]:
    """An OpenAI-compatible server in the shape vLLM answers (what ``VllmTextEngine`` reads)."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "max_model_len": 4096}]})

    async def tokenize(_: web.Request) -> web.Response:
        return web.json_response({"count": 16})

    async def completions(request: web.Request) -> web.StreamResponse:
        asked.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = [
            {"choices": [{"delta": {"content": answer}, "finish_reason": None}]},
            {"choices": [{"delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 2}},
        ]
        for chunk in chunks:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", completions)
    async with serve_plain(app) as url:
        yield url


async def test_a_worker_asks_the_vllm_server_itself(
    linked: None, config: ServerConfig, stt_weights: Path, tiny: TinyTTS, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []

    def over_the_link(*_: Any, **__: Any) -> Any:
        raise AssertionError("the reply's LLM request went through the engine process")

    monkeypatch.setattr(RemoteLLM, "generate", over_the_link)
    async with contextlib.aclosing(_fake_vllm("Paris.", asked)) as servers:
        vllm = await anext(servers)
        agent = _agent(config, stt_weights, tiny, in_workers=True)
        agent.cascade.llm_engine = "vllm"
        agent.http.vllm = agent.http.vllm.model_copy(update={"url": vllm, "model": "m"})
        async with serve_app(build_app(agent)) as base, aiohttp.ClientSession() as http:
            await until_ready(http, base, LOAD_TIMEOUT_S)
            async with http.ws_connect(ws_url(base, model="cascade")) as ws:
                assert (await _first_event(ws))["type"] == "session.created"
                user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "France?"}]}
                await ws.send_json({"type": "conversation.item.create", "item": user})
                await ws.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
                while (event := await _first_event(ws))["type"] != "response.done":
                    pass
    assert event["response"]["status"] == "completed", event
    assert [m["content"] for m in asked[0]["messages"] if m["role"] == "user"] == ["France?"]


async def test_a_worker_speaks_through_the_tts_server_itself(
    linked: None, config: ServerConfig, stt_weights: Path, tiny: TinyTTS
) -> None:
    """``cascade.tts: tts_server``: the worker's sessions speak through the TTS server (another
    rtserve with the tiny Kyutai TTS here); no Kyutai TTS engine runs in the engine process."""
    agent = _agent(config, stt_weights, tiny, in_workers=True)
    serving = agent.model_copy(update={"engine": "loopback", "cascade": config.cascade})  # the TTS server
    async with serve_app(build_app(serving)) as tts_base:
        agent.tts_engine = config.tts_engine  # no weights: nothing speaks here but the server
        agent.cascade.tts = "tts_server"
        agent.cascade.tts_server.url = tts_base.replace("http://", "ws://") + "/api/tts_streaming"
        await until_served(agent.cascade.tts_server.url)
        app = build_app(agent)
        assert isinstance(app[CTX].engines.session_engine, WorkerCascade)
        async with serve_app(app) as base, aiohttp.ClientSession() as http:
            await until_ready(http, base, LOAD_TIMEOUT_S)
            async with http.ws_connect(ws_url(base, model="cascade")) as ws:
                assert (await _first_event(ws))["type"] == "session.created"
                user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello?"}]}
                await ws.send_json({"type": "conversation.item.create", "item": user})
                await ws.send_json({"type": "response.create"})
                kinds: list[str] = []
                while (event := await _first_event(ws))["type"] != "response.done":
                    kinds.append(event["type"])
    assert event["response"]["status"] == "completed", event
    assert "response.output_audio.delta" in kinds
