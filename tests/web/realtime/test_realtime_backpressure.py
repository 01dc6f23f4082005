"""A client that stops reading costs only its own session: its bounded output buffer
overflows and that session closes with ``output_backpressure`` while another session on
the same engine keeps flowing; SIGTERM-style shutdown ends every session with
``session.closed{reason: "shutdown"}`` before the socket closes."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import websockets

from rtserve.app import build_app
from rtserve.config import ServerConfig
from tests.support import serve_app
from tests.web.realtime_support import (
    HANG_GUARD_S,
    closing_codes,
    loopback_config,
    pcm16_b64,
    read_to_close,
    read_until,
    receive_event,
    running,
    tagged_frame,
    types,
    ws_url,
)

OVERFLOWED = "rtserve_session_output_overflows_total 1.0"


async def test_stalled_reader_is_closed_with_output_backpressure_while_another_flows(config: ServerConfig) -> None:
    config = loopback_config(
        config, max_pending_output_bytes_per_session=32 * 1024, max_pending_output_events_per_session=16
    )
    config.transport.ws_send_buffer_bytes = 8192  # little kernel buffering: the backlog lands in the session
    async with running(config) as base, aiohttp.ClientSession() as http:
        # websockets stops reading the socket once max_queue messages wait unread.
        async with (
            websockets.connect(ws_url(base, duplex="1"), max_queue=1, max_size=None) as stalled,
            http.ws_connect(ws_url(base, duplex="1")) as healthy,
        ):
            assert json.loads(await stalled.recv())["type"] == "session.created"
            await receive_event(healthy)
            frames_meanwhile = 0
            for _ in range(int(HANG_GUARD_S * 20)):
                await read_until(healthy, "response.output_audio.delta")
                frames_meanwhile += 1
                async with http.get(f"{base}/metrics") as resp:
                    if OVERFLOWED in await resp.text():
                        break
            else:
                raise AssertionError("the stalled session never overflowed")

            tail = [json.loads(raw) async for raw in stalled]  # reading again: what was left, then the close
            assert stalled.close_code == 1000
            # The healthy session never noticed: its audio still comes back.
            await healthy.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(4))})
            await read_until(healthy, lambda e: e.get("delta") == pcm16_b64(tagged_frame(4)))
    assert frames_meanwhile > 0
    error = next(e for e in tail if e["type"] == "error")["error"]
    assert (error["code"], error["type"]) == ("output_backpressure", "rate_limit_error")
    done = next(e for e in tail if e["type"] == "response.done")["response"]
    assert done["status"] == "failed" and done["status_details"]["reason"] == "output_backpressure"
    assert tail[-1]["type"] == "session.closed" and tail[-1]["reason"] == "output_backpressure"
    assert types(tail).index("error") < types(tail).index("response.done")


async def test_shutdown_closes_every_session_with_reason_shutdown(config: ServerConfig) -> None:
    config = loopback_config(config)
    app = build_app(config)
    server = serve_app(app)
    base = await server.__aenter__()
    stopped = False
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(f"{base}/health") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.05)
            turn_based = await http.ws_connect(ws_url(base))
            duplex = await http.ws_connect(ws_url(base, duplex="1"))
            waiting = await http.ws_connect(ws_url(base, duplex="1", autostart="0"))  # no session yet
            for ws in (turn_based, duplex):
                assert (await receive_event(ws) or {}).get("type") == "session.created"
            stopping = asyncio.create_task(server.__aexit__(None, None, None))
            tails = [await read_to_close(ws) for ws in (turn_based, duplex, waiting)]
            await asyncio.wait_for(stopping, HANG_GUARD_S)
            stopped = True
            codes = [closing_codes[ws] for ws in (turn_based, duplex, waiting)]
    finally:
        if not stopped:
            await server.__aexit__(None, None, None)
    for tail in tails[:2]:
        assert tail[-1]["type"] == "session.closed" and tail[-1]["reason"] == "shutdown"
    assert tails[2] == []
    assert codes == [aiohttp.WSCloseCode.GOING_AWAY] * 3
