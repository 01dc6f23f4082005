"""Client-set session fields and the conversation are bounded by ``sessions`` config
(issue 17, items 2-3): over a bound, a typed error naming the field; the session carries
on (never a misleading ``output_backpressure`` close)."""

from __future__ import annotations

import aiohttp

from rtserve.config import ServerConfig
from tests.web.realtime_support import loopback_config, read_until, receive_event, running, ws_url


async def next_error(ws: aiohttp.ClientWebSocketResponse) -> dict:
    return (await read_until(ws, "error"))[-1]["error"]


def text_item(text: str, item_id: str) -> dict:
    return {
        "type": "conversation.item.create",
        "event_id": item_id,
        "item": {"id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }


async def test_oversized_session_fields_are_refused_by_name_and_the_session_carries_on(config: ServerConfig) -> None:
    limits = config.sessions
    cases = [
        ({"instructions": "x" * (3 * 1024 * 1024)}, "session.instructions"),
        ({"instructions": "x" * (limits.max_instructions_chars + 1)}, "session.instructions"),
        ({"voice": "v" * 100_000}, "session.voice"),
        ({"max_output_tokens": 10**100}, "session.max_output_tokens"),
        ({"max_output_tokens": limits.max_output_tokens + 1}, "session.max_output_tokens"),
    ]
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as ws:
            await receive_event(ws)
            for session, param in cases:
                await ws.send_json({"type": "session.update", "session": session, "event_id": param})
                error = await next_error(ws)
                assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", param, param), error
            await ws.send_json(
                {
                    "type": "response.create",
                    "event_id": "r1",
                    "response": {"instructions": "y" * (limits.max_instructions_chars + 1)},
                }
            )
            error = await next_error(ws)
            assert (error["code"], error["param"]) == ("invalid_value", "response.instructions"), error
            await ws.send_json(
                {
                    "type": "session.update",
                    "session": {
                        "instructions": "x" * limits.max_instructions_chars,
                        "max_output_tokens": limits.max_output_tokens,
                    },
                }
            )
            updated = (await read_until(ws, "session.updated"))[-1]["session"]
    assert len(updated["instructions"]) == limits.max_instructions_chars


async def add_item(ws: aiohttp.ClientWebSocketResponse, text: str, item_id: str) -> dict | None:
    """None when the item was added, else the error refusing it."""
    await ws.send_json(text_item(text, item_id))
    answer = (
        await read_until(
            ws,
            lambda e: (
                e.get("error", {}).get("event_id") == item_id
                or (e["type"] == "conversation.item.done" and e["item"]["id"] == item_id)
            ),
        )
    )[-1]
    return answer.get("error")


async def test_a_conversation_over_its_item_or_byte_cap_refuses_new_items(config: ServerConfig) -> None:
    config = loopback_config(config, max_conversation_items=4, max_conversation_bytes=64 * 1024)
    async with running(config) as base, aiohttp.ClientSession() as http, http.ws_connect(ws_url(base)) as ws:
        await receive_event(ws)
        too_big = await add_item(ws, "z" * (64 * 1024 + 1), "too-big")
        added = 0
        while (too_many := await add_item(ws, "short", f"i{added}")) is None:
            added += 1
            assert added <= 4
        await ws.send_json({"type": "conversation.item.delete", "item_id": "i0"})
        await read_until(ws, "conversation.item.deleted")
        fits_again = await add_item(ws, "fits again", "again")
    assert added >= 2  # the loopback's own answer item counts too
    for error, event_id in ((too_big, "too-big"), (too_many, f"i{added}")):
        assert error is not None
        assert (error["code"], error["param"], error["event_id"]) == (
            "conversation_limit_exceeded",
            "item",
            event_id,
        ), error
    assert fits_again is None
