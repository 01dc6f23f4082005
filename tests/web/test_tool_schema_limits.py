"""Large and hostile tool sets over real sockets: bounded before compiling, compiled off the loop.

Compiling 128 schemas of ~30 KB with llguidance takes over a second of CPU; that work used to
run on the event loop (``/health`` stalled for the whole request: 1-4 s on a loaded 2-core
machine). It now runs on the codec executor, so the loop answers ``/health`` meanwhile, and a
set over ``sessions.max_tool_schema_bytes`` is refused before anything compiles. Recursive
schemas, which no grammar bounds (a forced call used to end as ``{"a"`` with ``stop``), are
refused naming the tool.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import aiohttp

from rtserve.config import ServerConfig
from tests.web.http_support import serve_doubles
from tests.web.realtime_support import loopback_config, receive_event, running, ws_url

TOOLS = 128
# The loop's longest stall as a share of the request: ~0.95 with the compile on the loop; what is
# left (0.1-0.2) is parsing the JSON itself, bounded by http.max_json_body_bytes and holding the GIL
# wherever it runs.
STALL_SHARE = 1 / 3


def big_tools(count: int = TOOLS) -> list[dict[str, Any]]:
    """``count`` function tools with ~30 KB schemas each, unlike any checked before (the verdict
    cache is process-wide)."""
    nonce = uuid.uuid4().hex
    return [
        {
            "name": f"tool_{i}",
            "parameters": {
                "type": "object",
                "properties": {f"f{i}_{k}_{nonce}": {"type": "string", "description": "x" * 180} for k in range(140)},
            },
        }
        for i in range(count)
    ]


def chat_body(tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "double-llm",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": tool} for tool in tools],
    }


def encoded(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as request arguments, encoded before the request (the client shares the server's loop)."""
    return {"data": json.dumps(body).encode(), "headers": {"Content-Type": "application/json"}}


async def worst_health_gap(http: aiohttp.ClientSession, base: str, work: Awaitable[Any]) -> tuple[float, Any]:
    """The longest time between two ``/health`` answers (less the pause between asking) while
    ``work`` runs, and its result. Client and server share one loop: a stall anywhere shows."""
    task = asyncio.ensure_future(work)
    worst = 0.0
    answered = time.perf_counter()
    while not task.done():
        await asyncio.sleep(0.01)
        async with http.get(f"{base}/health") as resp:
            await resp.read()
        worst = max(worst, time.perf_counter() - answered - 0.01)
        answered = time.perf_counter()
    return worst, await task


def generous(config: ServerConfig) -> ServerConfig:
    config.sessions.max_tool_schema_bytes = 16 * 1024 * 1024
    config.http.max_json_body_bytes = 16 * 1024 * 1024
    return config


async def test_chat_tools_compile_off_the_event_loop(config: ServerConfig) -> None:
    request = encoded(chat_body(big_tools()))
    assert len(request["data"]) > 3_500_000
    async with serve_doubles(generous(config)) as (base, engine), aiohttp.ClientSession() as http:

        async def chat() -> tuple[int, float]:
            started = time.perf_counter()
            async with http.post(f"{base}/v1/chat/completions", **request) as resp:
                await resp.read()
                return resp.status, time.perf_counter() - started

        worst, (status, took) = await worst_health_gap(http, base, chat())
    assert status == 200 and engine.llm.seen
    assert worst < took * STALL_SHARE, (worst, took)


async def test_chat_tools_over_the_schema_bound_are_refused_before_compiling(config: ServerConfig) -> None:
    config.http.max_json_body_bytes = 16 * 1024 * 1024
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        started = time.perf_counter()
        async with http.post(f"{base}/v1/chat/completions", **encoded(chat_body(big_tools()))) as resp:
            body = await resp.json()
        took = time.perf_counter() - started
    assert resp.status == 400
    assert (body["error"]["code"], body["error"]["param"]) == ("invalid_value", "tools")
    assert f"more than {config.sessions.max_tool_schema_bytes} bytes" in body["error"]["message"]
    assert took < 1.0 and not engine.llm.seen  # the JSON is read and measured, nothing compiled


RECURSIVE = {"name": "walk", "parameters": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}


async def test_chat_refuses_a_recursive_schema(config: ServerConfig) -> None:
    body = {**chat_body([RECURSIVE]), "tool_choice": {"type": "function", "function": {"name": "walk"}}}
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
            error = (await resp.json())["error"]
    assert resp.status == 400 and not engine.llm.seen
    assert (error["code"], error["param"]) == ("invalid_value", "tools[0].parameters")
    assert "recursive" in error["message"]


async def test_realtime_tools_compile_off_the_event_loop(config: ServerConfig) -> None:
    tools = [{"type": "function", **tool} for tool in big_tools()]
    async with running(generous(loopback_config(config))) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base), max_msg_size=0) as ws:
            assert (await receive_event(ws) or {}).get("type") == "session.created"

            async def error() -> dict[str, Any]:
                while True:
                    event = await receive_event(ws)
                    assert event is not None, "the server closed the socket"
                    if event["type"] == "error":
                        return event

            async def update(session: dict[str, Any], event_id: str) -> dict[str, Any]:
                await ws.send_str(json.dumps({"type": "session.update", "event_id": event_id, "session": session}))
                return await error()

            async def send_big() -> dict[str, Any]:
                await ws.send_str(text)
                return await error()

            text = json.dumps({"type": "session.update", "event_id": "big", "session": {"tools": tools}})
            started = time.perf_counter()
            worst, event = await worst_health_gap(http, base, send_big())
            took = time.perf_counter() - started
            # The loopback engine cannot call functions: refused, after the schemas compiled.
            assert (event["type"], event.get("error", {}).get("param")) == ("error", "session.tools"), event
            assert worst < took * STALL_SHARE, (worst, took)

            event = await update({"tools": [{"type": "function", **RECURSIVE}]}, "recursive")
            assert (event["error"]["param"], event["error"]["event_id"]) == ("session.tools[0].parameters", "recursive")
            assert "recursive" in event["error"]["message"]
