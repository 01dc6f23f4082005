"""Hostile or careless client input at the HTTP and WebSocket front door (issue 17, items 7
and 8): the API key offered as a WebSocket subprotocol never reaches the log and completes
a browser's handshake on the realtime, Moshi and openpi routes; malformed headers, JSON nested past the parser's depth
and out-of-range seeds get typed 4xx errors, never a 500."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from rtserve.app import build_app
from rtserve.config import ServerConfig
from tests.support import serve_app
from tests.web.http_support import serve_doubles as serve
from tests.web.realtime_support import loopback_config, read_until, receive_event, running, ws_url
from tests.web.test_base_routes import GatedStartEngine

KEY = "sk-very-secret-0123456789"
KEY_PROTOCOL = f"openai-insecure-api-key.{KEY}"
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("path", ["/api/chat", "/v1/audio/duplex", "/v1/realtime", "/v1/realtime/robot/openpi"])
async def test_a_key_subprotocol_completes_the_handshake_and_never_reaches_the_log(
    config: ServerConfig, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    config.api_key = KEY
    caplog.set_level(logging.DEBUG)
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, path), protocols=(KEY_PROTOCOL,)) as ws:
            assert ws.protocol == KEY_PROTOCOL  # a browser fails a handshake that answers none it offered
        wrong = KEY_PROTOCOL + "-wrong"
        async with http.ws_connect(ws_url(base, path), protocols=(wrong,)) as ws:
            assert ws.protocol == wrong
            assert (await ws.receive()).type == aiohttp.WSMsgType.CLOSE and ws.close_code == 4001
    assert not [r for r in caplog.records if KEY in r.getMessage()]


async def test_a_non_utf8_authorization_header_is_401(config: ServerConfig) -> None:
    config.api_key = KEY
    async with serve_app(build_app(config, engine=GatedStartEngine())) as base:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc3\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 401"), head[:200]
    assert b'"invalid_api_key"' in head


async def test_json_nested_past_the_parser_depth_is_a_typed_400(config: ServerConfig) -> None:
    async with serve(config) as (base, _doubles), aiohttp.ClientSession() as http:
        for path in ("/v1/chat/completions", "/v1/audio/speech"):
            async with http.post(f"{base}{path}", data=DEEP_JSON, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 400, path
                assert (await resp.json())["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("seed", [2**64, 1e30, -1])
async def test_an_out_of_range_seed_is_invalid_value(config: ServerConfig, seed: float) -> None:
    messages = [{"role": "user", "content": "hi"}]
    requests = {
        "/v1/chat/completions": {"messages": messages, "seed": seed},
        "/v1/chat/completions/batch": {"messages": [messages], "seed": seed},
    }
    async with serve(config) as (base, _doubles), aiohttp.ClientSession() as http:
        for path, body in requests.items():
            async with http.post(f"{base}{path}", json=body) as resp:
                assert resp.status == 400, path
                error = (await resp.json())["error"]
                assert (error["code"], error["param"]) == ("invalid_value", "seed"), (path, error)


async def test_json_nested_past_the_parser_depth_is_a_typed_error_on_websockets(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as ws:
            await receive_event(ws)
            await ws.send_str(DEEP_JSON)
            realtime = (await read_until(ws, "error"))[-1]["error"]
            await ws.send_json({"type": "session.update", "session": {"instructions": "still here"}})
            await read_until(ws, "session.updated")
        async with http.ws_connect(ws_url(base, "/v1/audio/duplex")) as ws:
            await ws.send_str(DEEP_JSON)
            moshi = await asyncio.wait_for(ws.receive_json(), 10)
            await ws.send_json({"type": "nonsense"})
            still_serving = await asyncio.wait_for(ws.receive_json(), 10)
    assert realtime["code"] == "invalid_event"
    assert moshi["code"] == "invalid_json" and still_serving["code"] == "unknown_type"
