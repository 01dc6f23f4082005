"""HTTP read bounds over raw sockets (issue 17 item 6, item 2's HTTP part): slow or silent
request heads and bodies are cut, a refused generation never reads its body, JSON bodies
have their own size bound, and a chat prompt is bounded in characters before any model work."""

from __future__ import annotations

import asyncio
import functools
import json
import time

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.web.http_support import sdk, serve_doubles

MB = 1024 * 1024


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def _connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", _port(base))


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sent until it closed the connection; fails if it stays open."""
    return await asyncio.wait_for(reader.read(), timeout=seconds)


def _post_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


async def test_half_a_request_line_is_closed_within_the_timeout(config):
    config.transport.http_keepalive_timeout_s = 0.5
    async with serve_doubles(config) as (base, _):
        reader, writer = await _connect(base)
        writer.write(b"GET /hea")  # and then nothing
        started = time.monotonic()
        assert await _closed_within(reader, 5) == b""
        assert time.monotonic() - started < 3
        writer.close()


async def test_a_silent_connection_is_closed_within_the_timeout(config):
    config.transport.http_keepalive_timeout_s = 0.5
    async with serve_doubles(config) as (base, _):
        reader, writer = await _connect(base)
        assert await _closed_within(reader, 5) == b""
        writer.close()


async def test_a_slow_body_gets_408_and_the_connection_closes(config):
    config.transport.http_body_timeout_s = 0.3
    config.transport.http_body_min_bytes_per_s = 1024 * 1024  # 1000 declared bytes add ~1 ms
    config.transport.http_lingering_s = 0.2
    async with serve_doubles(config) as (base, engine):
        reader, writer = await _connect(base)
        writer.write(_post_head("/v1/chat/completions", 1000) + b'{"messages": [')
        started = time.monotonic()
        response = await _closed_within(reader, 5)
        assert time.monotonic() - started < 3
        assert _status(response) == 408
        assert b'"code":"request_timeout"' in response.replace(b" ", b"")
        assert engine.llm.control.calls == 0
        writer.close()


async def _record(connections: list[None]) -> None:
    connections.append(None)


async def test_a_keep_alive_client_is_unaffected(config):
    """Requests spaced within the idle timeout, and a generation outlasting it, share one connection."""
    config.transport.http_keepalive_timeout_s = 0.5
    connections: list[None] = []
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(lambda *_: _record(connections))
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession(trace_configs=[trace]) as http:
        chat = {"messages": [{"role": "user", "content": "hi there"}]}
        engine.llm.control.hold = asyncio.Event()
        for i in range(3):
            call = asyncio.ensure_future(http.post(f"{base}/v1/chat/completions", json=chat))
            if i == 0:
                await asyncio.sleep(1.0)  # the first generation runs past the idle timeout
                engine.llm.control.hold.set()
            async with await call as resp:
                assert resp.status == 200
                assert (await resp.json())["choices"][0]["message"]["content"] == "echo: hi there"
            await asyncio.sleep(0.2)
        assert len(connections) == 1


async def test_a_generation_beyond_the_limit_is_refused_before_its_body_is_read(config):
    config.transport.max_concurrent_http_generations = 1
    config.http.max_json_body_bytes = 128 * MB  # the refusal must come from the limiter, not the size bound
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.llm.control.hold = asyncio.Event()
        async with http.post(
            f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True}
        ) as held:
            await held.content.readuntil(b"\n\n")
            for path in ("/v1/chat/completions", "/v1/audio/speech", "/v1/audio/transcriptions"):
                reader, writer = await _connect(base)
                writer.write(_post_head(path, 60 * MB))  # headers only: a 60 MB body that never comes
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
                assert _status(head) == 429, path
                writer.close()
            engine.llm.control.hold.set()
            await held.read()
        assert engine.llm.control.calls == 1


async def test_a_json_body_over_its_bound_is_413_from_its_declared_length(config):
    async with serve_doubles(config) as (base, _engine):
        for path in ("/v1/chat/completions", "/v1/chat/completions/batch", "/v1/audio/speech"):
            reader, writer = await _connect(base)
            writer.write(_post_head(path, 60 * MB))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert _status(head) == 413, path
            writer.close()


async def test_a_chunked_json_body_is_cut_at_its_bound_while_streaming(config):
    config.http.max_json_body_bytes = 64 * 1024

    async def body():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * 4096  # 256 KiB in all, no Content-Length
        yield b'"}]}'

    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/chat/completions", data=body(), headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["code"] == "request_too_large"
        assert engine.llm.control.calls == 0


async def test_a_chat_prompt_over_its_character_bound_is_refused_before_the_model(config):
    config.http.max_prompt_chars = 10_000
    async with serve_doubles(config) as (base, engine):
        client = sdk(base)
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": "s" * 6000},
            {"role": "user", "content": "u " * 2500},
        ]
        with pytest.raises(openai.BadRequestError) as refused:
            await asyncio.to_thread(
                functools.partial(client.chat.completions.create, model="double-llm", messages=messages)
            )
        error = refused.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
        assert "10000" in error["message"]
        assert engine.llm.control.calls == 0
        fits = await asyncio.to_thread(
            functools.partial(
                client.chat.completions.create, model="double-llm", messages=[{"role": "user", "content": "u " * 4000}]
            )
        )
        assert fits.choices[0].finish_reason in ("stop", "length")


async def test_the_prompt_bound_follows_the_models_context_by_default(config):
    config.cascade.llm_context_tokens = 256  # the double stands in for the cascade's LLM
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        long_chat = {"messages": [[{"role": "user", "content": "x" * 50_000}]]}
        async with http.post(f"{base}/v1/chat/completions/batch", json=long_chat) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages[0]")
        assert engine.llm.control.calls == 0
        async with http.post(
            f"{base}/v1/chat/completions",
            data=json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}),
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200
