"""Silent realtime clients give their slots back (issue 30, ``sessions.inactivity_timeout_s``,
docs/sessions.md#close-and-expiry), over a real socket: each gets the typed error, then
the close, and the slots are free for new sessions."""

from __future__ import annotations

import asyncio

import aiohttp

from rtserve.config import ServerConfig
from tests.web.realtime_support import closing_codes, loopback_config, read_to_close, receive_event, running, ws_url


async def slots_in_use(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    [line] = [line for line in text.splitlines() if line.startswith("rtserve_sessions_slots_in_use ")]
    return float(line.split()[1])


async def test_silent_sessions_are_closed_with_a_typed_error_and_free_their_slots(config: ServerConfig) -> None:
    config = loopback_config(config, max_sessions=2, inactivity_timeout_s=0.5)
    async with running(config) as base, aiohttp.ClientSession() as http:
        turn_based = await http.ws_connect(ws_url(base))
        duplex = await http.ws_connect(ws_url(base, duplex="1"))
        for ws in (turn_based, duplex):
            assert (await receive_event(ws) or {}).get("type") == "session.created"
        assert await slots_in_use(http, base) == 2
        async with http.ws_connect(ws_url(base)) as refused:  # every slot is held
            assert [e["error"]["code"] for e in await read_to_close(refused) if e["type"] == "error"] == [
                "resource_exhausted"
            ]
        for ws in (turn_based, duplex):  # neither sends anything
            events = await read_to_close(ws)
            errors = [e["error"] for e in events if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["session_idle_timeout"]
            assert errors[0]["type"] == "invalid_request_error" and "0.5 s" in errors[0]["message"]
            assert events[-1]["type"] == "session.expired" and events[-1]["reason"] == "session_idle_timeout"
            assert closing_codes[ws] == aiohttp.WSCloseCode.OK
            await ws.close()
        for _ in range(100):
            if await slots_in_use(http, base) == 0:
                break
            await asyncio.sleep(0.02)
        assert await slots_in_use(http, base) == 0
        async with http.ws_connect(ws_url(base)) as again:  # a new client is admitted
            assert (await receive_event(again) or {}).get("type") == "session.created"
