"""Bad client frames on ``WS /v1/realtime`` (raw WebSocket): the seed error table with its
exact codes and messages, typed errors for unsupported values, limits (message size,
admission), auth subprotocols. None of them disturbs the session or the server."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest

from rtserve.config import ServerConfig
from tests.web.realtime_support import (
    FRAME,
    audio_of,
    close_code,
    loopback_config,
    pcm16_b64,
    read_until,
    receive_event,
    running,
    tagged_frame,
    ws_url,
)

SEED_TABLE = [
    # (frame, error field compared, expected value, message must contain) — docs/serving.md#errors
    ("{not-json", "code", "invalid_event", "Invalid or unrecognized client event"),
    ({"type": "session.update"}, "code", "invalid_event", "Invalid or unrecognized client event"),
    ({"type": "session.update", "session": []}, "code", "invalid_event", "Invalid or unrecognized client event"),
    ({"type": "input_audio_buffer.commit"}, "type", "invalid_request_error", "Input audio buffer is empty"),
    ({"type": "unknown.event"}, "code", "invalid_event", "Invalid or unrecognized client event"),
    (
        {"type": "input_audio_buffer.append", "audio": "not-valid-base64!!!"},
        "type",
        "invalid_request_error",
        "Invalid base64 audio data",
    ),
]


def as_text(frame: str | dict) -> str:
    return frame if isinstance(frame, str) else json.dumps({**frame, "event_id": "evt_client_1"})


async def next_error(ws: aiohttp.ClientWebSocketResponse) -> dict:
    return (await read_until(ws, "error"))[-1]["error"]


@pytest.mark.parametrize("frame,field,expected,message", SEED_TABLE)
@pytest.mark.parametrize("query", [{}, {"duplex": "1"}])
async def test_seed_error_table(config: ServerConfig, frame, field, expected, message, query) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, **query)) as ws:
            assert (await receive_event(ws) or {}).get("type") == "session.created"
            await ws.send_str(as_text(frame))
            error = await next_error(ws)
            assert error[field] == expected
            assert message in error["message"]
            assert set(error) >= {"type", "code", "message", "param", "event_id"}
            if not isinstance(frame, str):
                assert error["event_id"] == "evt_client_1"  # the client's own event id is echoed
            # The session is undisturbed: its audio still comes back.
            await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(7))})
            await read_until(ws, lambda e: "delta" in e and (audio_of([e]) == tagged_frame(7)).all())


async def test_unsupported_values_get_typed_errors_with_param(config: ServerConfig) -> None:
    cases = [
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "invalid_value", "session.audio.input.format"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "invalid_value",
            "session.audio.input.format.rate",
        ),
        ({"turn_detection": {"type": "turn_model"}}, "unsupported_turn_detection", "session.turn_detection.type"),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
            "unsupported_turn_detection",
            "session.audio.input.turn_detection",
        ),  # loopback has no VAD
        ({"type": "transcription"}, "invalid_value", "session.type"),
        ({"temperature": 9}, "invalid_value", "session.temperature"),
        ({"max_output_tokens": 0}, "invalid_event", "session.max_output_tokens"),
    ]
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as ws:
            created = await receive_event(ws)
            assert created is not None
            for session, code, param in cases:
                await ws.send_json({"type": "session.update", "session": session, "event_id": param})
                error = await next_error(ws)
                assert (error["code"], error["param"], error["event_id"]) == (code, param, param), error
            # Nothing of the refused updates was applied.
            await ws.send_json({"type": "session.update", "session": {"instructions": "still fine"}})
            updated = (await read_until(ws, "session.updated"))[-1]["session"]
    assert updated["audio"] == created["session"]["audio"]
    assert updated["temperature"] == created["session"]["temperature"]


async def test_binary_frames_and_duplex_events_are_not_part_of_the_turn_based_protocol(config) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as ws:
            await receive_event(ws)
            await ws.send_bytes(b"\x00\x01")
            assert (await next_error(ws))["code"] == "invalid_event"
            await ws.send_json({"type": "session.heartbeat"})
            error = await next_error(ws)
            assert (error["code"], error["param"]) == ("invalid_event", "type")


async def test_a_frame_over_the_size_limit_closes_only_that_socket(config: ServerConfig) -> None:
    config.transport.max_ws_message_bytes = 64 * 1024
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as big, http.ws_connect(ws_url(base)) as other:
            await receive_event(big)
            await receive_event(other)
            await big.send_json({"type": "input_audio_buffer.append", "audio": "A" * (128 * 1024)})
            assert await close_code(big) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
            # Exactly at the limit's side: a normal append still works on the other socket.
            await other.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(9))})
            await read_until(other, lambda e: "delta" in e and (audio_of([e]) == tagged_frame(9)).all())


async def test_capacity_refuses_with_resource_exhausted_and_no_session(config: ServerConfig) -> None:
    async with running(loopback_config(config, max_sessions=1)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as first:
            assert (await receive_event(first) or {}).get("type") == "session.created"
            async with http.ws_connect(ws_url(base, duplex="1")) as second:
                refused = await receive_event(second)
                assert refused is not None
                assert refused["type"] == "error"
                assert refused["error"]["code"] == "resource_exhausted"
                assert await close_code(second) == aiohttp.WSCloseCode.TRY_AGAIN_LATER  # no session.created


async def test_realtime_subprotocol_is_echoed_and_key_subprotocol_authenticates(config: ServerConfig) -> None:
    config.api_key = "sekrit"
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base), protocols=("realtime", "openai-insecure-api-key.sekrit")) as ws:
            assert ws.protocol == "realtime"
            assert (await receive_event(ws) or {}).get("type") == "session.created"
        async with http.ws_connect(ws_url(base), protocols=("realtime", "openai-insecure-api-key.wrong")) as ws:
            assert await close_code(ws) == 4001
        # A browser that offered only its key still gets a subprotocol back (else it fails the handshake).
        async with http.ws_connect(ws_url(base), protocols=("openai-insecure-api-key.sekrit",)) as ws:
            assert ws.protocol == "openai-insecure-api-key.sekrit"
            assert (await receive_event(ws) or {}).get("type") == "session.created"


async def test_response_create_and_commit_on_a_lockstep_engine_say_why(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as ws:
            await receive_event(ws)
            await ws.send_json({"type": "response.create", "event_id": "r1"})
            error = await next_error(ws)
            assert (error["code"], error["event_id"]) == ("turn_control_unsupported", "r1")
            await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(np.zeros(FRAME))})
            await ws.send_json({"type": "input_audio_buffer.commit", "event_id": "c1"})
            error = await next_error(ws)
            assert (error["code"], error["event_id"]) == ("turn_control_unsupported", "c1")
            await ws.send_json({"type": "input_audio_buffer.clear"})
            await read_until(ws, "input_audio_buffer.cleared")
            await ws.send_json({"type": "input_audio_buffer.commit", "event_id": "c2"})
            error = await next_error(ws)  # cleared: empty again
            assert error["code"] == "input_audio_buffer_commit_empty"
            assert error["message"] == "Input audio buffer is empty"


async def test_a_connection_that_never_opens_a_session_is_closed_when_idle(config: ServerConfig) -> None:
    async with running(loopback_config(config, idle_ttl_s=0.2)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, autostart="0")) as ws:
            assert await close_code(ws) == aiohttp.WSCloseCode.OK


async def test_a_large_append_is_decoded_off_the_loop_and_the_session_carries_on(config: ServerConfig) -> None:
    ten_seconds = np.tile(tagged_frame(1), 125)  # 640k base64 chars: parsed and decoded on a worker thread
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base)) as ws:
            await receive_event(ws)
            await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(ten_seconds)})
            await ws.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(2))})
            seen = await read_until(ws, lambda e: "delta" in e and (audio_of([e]) == tagged_frame(2)).all())
    assert "error" not in [e["type"] for e in seen]


async def test_a_peer_that_stops_answering_pings_is_dropped_and_its_session_closed(config: ServerConfig) -> None:
    config.transport.ws_heartbeat_s = 0.2
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base), autoping=False) as ws:  # never answers the server's pings
            for _ in range(5000):  # events and pings, until the server gives up on this peer
                message = await asyncio.wait_for(ws.receive(), 15)
                if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
            else:
                raise AssertionError("the server kept a silent peer")
        line = 'rtserve_sessions_ended_total{kind="closed",reason="disconnect"} 1.0'
        for _ in range(300):
            async with http.get(f"{base}/metrics") as resp:
                if line in await resp.text():
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the dropped peer's session was not closed")
