"""Limits and failure paths shared by the HTTP generation routes, over a real socket:
concurrency (429), client disconnect (the engine's stream is closed), body size (413),
API key (401), models not ready / not served (503), and what /v1/models lists."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from rtserve.app import build_app
from tests.support import serve_app
from tests.web.http_support import (
    EchoLLMDouble,
    NoTurnEnginesDouble,
    ToneASRDouble,
    ToneTTSDouble,
    TurnEnginesSessionDouble,
    audio_file,
    sdk,
    serve_doubles,
)

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]
STREAM_CHAT = {"messages": HELLO, "stream": True}


async def in_flight(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    line = next(ln for ln in text.splitlines() if ln.startswith("rtserve_http_generations_in_flight "))
    return float(line.split()[1])


async def wait_for(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), timeout=10)


async def test_generation_beyond_the_limit_is_429_not_queued(config):
    config.transport.max_concurrent_http_generations = 1
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.llm.control.hold = asyncio.Event()
        async with http.post(f"{base}/v1/chat/completions", json=STREAM_CHAT) as held:
            await held.content.readuntil(b"\n\n")  # the first generation is running
            async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as refused:
                assert refused.status == 429
                assert refused.headers["Retry-After"] == "1"
                error = (await refused.json())["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
            engine.llm.control.hold.set()
            assert (await held.read()).endswith(b"data: [DONE]\n\n")
        assert await in_flight(http, base) == 0
        completion = await asyncio.to_thread(
            functools.partial(sdk(base).chat.completions.create, model="double-llm", messages=HELLO)
        )
        assert completion.choices[0].message.content == "echo: hello there"
        async with http.get(f"{base}/metrics") as resp:
            assert "rtserve_http_generations_rejected_total 1.0" in await resp.text()


async def test_disconnect_during_a_stream_closes_the_engine_stream(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.llm.control.hold = asyncio.Event()  # never set: only the disconnect can end it
        resp = await http.post(f"{base}/v1/chat/completions", json=STREAM_CHAT)
        await resp.content.readuntil(b"\n\n")
        resp.close()
        await wait_for(engine.llm.control.closed)
        for _ in range(100):
            if await in_flight(http, base) == 0:
                break
            await asyncio.sleep(0.02)
        assert await in_flight(http, base) == 0


@pytest.mark.parametrize("route", ["chat", "speech", "transcription"])
async def test_disconnect_mid_generation_cancels_it(config, route):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        doubles: dict[str, EchoLLMDouble | ToneTTSDouble | ToneASRDouble] = {
            "chat": engine.llm,
            "speech": engine.tts,
            "transcription": engine.asr,
        }
        double = doubles[route]
        double.control.hold = asyncio.Event()  # first item produced, then the engine "works" forever
        if route == "chat":
            call = http.post(f"{base}/v1/chat/completions", json={"messages": HELLO})
        elif route == "speech":
            call = http.post(f"{base}/v1/audio/speech", json={"input": "one two", "voice": "low"})
        else:
            form = aiohttp.FormData()
            form.add_field("file", audio_file("wav", "pcm_s16le", 16000, seconds=3), filename="a.wav")
            call = http.post(f"{base}/v1/audio/transcriptions", data=form)
        client = asyncio.ensure_future(call)
        await wait_for(double.control.started)
        if route == "speech":  # speech answers as soon as the first chunk exists: take the headers
            (await client).close()
        else:
            client.cancel()
        await wait_for(double.control.closed)


async def test_bodies_over_the_limit_are_413(config):
    config.transport.max_http_body_bytes = 2048
    big_text = "x" * 4000
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": big_text}]}
        ) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["code"] == "request_too_large"

        async def chunked():  # no Content-Length: the limit must hold while reading
            for _ in range(4):
                yield b" " * 1000

        async with http.post(
            f"{base}/v1/audio/speech", data=chunked(), headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["code"] == "request_too_large"

        form = aiohttp.FormData()
        form.add_field("file", audio_file("wav", "pcm_s16le", 16000, seconds=1), filename="a.wav")
        async with http.post(f"{base}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 413
    assert engine.llm.control.calls == engine.tts.control.calls == engine.asr.control.calls == 0


async def test_api_key_is_required_when_configured(config):
    config.api_key = "secret"
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        with pytest.raises(openai.AuthenticationError):
            await asyncio.to_thread(
                functools.partial(
                    sdk(base, api_key="wrong").chat.completions.create, model="double-llm", messages=HELLO
                )
            )
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "invalid_api_key"
        completion = await asyncio.to_thread(
            functools.partial(sdk(base, api_key="secret").chat.completions.create, model="double-llm", messages=HELLO)
        )
        assert completion.choices[0].message.content == "echo: hello there"


class GatedTurnEnginesDouble(TurnEnginesSessionDouble):
    """Test double: models "load" only when the test opens the gate (or fail to)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.fail = fail

    async def start(self) -> None:
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("weights missing")
        await super().start()


async def test_routes_are_503_until_models_load(config):
    engine = GatedTurnEnginesDouble()
    async with serve_app(build_app(config, engine=engine)) as base, aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json={"messages": HELLO}) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "5"
            assert (await resp.json())["error"]["code"] == "model_not_ready"
        engine.gate.set()
        for _ in range(100):
            async with http.post(f"{base}/v1/chat/completions", json={"messages": HELLO}) as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.01)
        assert resp.status == 200


async def test_routes_are_503_engine_failed_after_a_failed_load(config):
    engine = GatedTurnEnginesDouble(fail=True)
    engine.gate.set()
    async with serve_app(build_app(config, engine=engine)) as base, aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.post(f"{base}/v1/audio/speech", json={"input": "hi"}) as resp:
                error = (await resp.json())["error"]
            if error["code"] == "engine_failed":
                break
            await asyncio.sleep(0.01)
        assert (resp.status, error["code"]) == (503, "engine_failed")
        assert "weights" not in error["message"]


async def test_tasks_the_engine_does_not_serve_are_503_task_unavailable(config):
    async with serve_app(build_app(config, engine=NoTurnEnginesDouble())) as base, aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("file", b"x", filename="a.wav")
        requests: list[tuple[str, dict[str, Any]]] = [
            ("/v1/chat/completions", {"json": {"messages": HELLO}}),
            ("/v1/audio/speech", {"json": {"input": "hi"}}),
            ("/v1/audio/transcriptions", {"data": form}),
        ]
        for path, kwargs in requests:
            async with http.post(f"{base}{path}", **kwargs) as resp:
                assert resp.status == 503
                error = (await resp.json())["error"]
                assert error["code"] == "task_unavailable"
                assert "frames-only" in error["message"]


async def test_models_lists_every_served_model_through_the_sdk(config):
    async with serve_doubles(config) as (base, _):
        models = await asyncio.to_thread(lambda: list(sdk(base).models.list()))
    assert [m.id for m in models] == ["double", "double-asr", "double-llm", "double-tts"]
