"""What vLLM-Omni's duplex clients read and send on ``WS /v1/realtime?duplex=1``
(docs/peers.md#vllm-omni-duplex-clients), over a raw ``websockets`` socket as their ``DuplexClient`` uses (issue 16):
the capability keys, ``input.text.append`` (and its aliases) and ``input.cancel``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets

from rtserve.config import ServerConfig
from tests.web.realtime_support import HANG_GUARD_S, loopback_config, running, ws_url


async def next_of(ws: Any, kind: str, role: str | None = None) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), HANG_GUARD_S))
        if event["type"] == kind and (role is None or event["item"]["role"] == role):
            return event


async def test_capability_keys_text_append_and_input_cancel(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, websockets.connect(ws_url(base, duplex="1")) as ws:
        created = await next_of(ws, "session.created")
        await ws.send(json.dumps({"type": "input.text.append", "text": "turn left", "event_id": "t1"}))
        added = await next_of(ws, "conversation.item.added", "user")
        await ws.send(json.dumps({"type": "push_text", "text": "then stop"}))
        alias = await next_of(ws, "conversation.item.added", "user")
        epoch_before = alias["epoch"]
        await ws.send(json.dumps({"type": "input.cancel", "event_id": "c1"}))
        cleared = await next_of(ws, "input_audio_buffer.cleared")
        await ws.send(json.dumps({"type": "session.heartbeat"}))
        after = await next_of(ws, "session.heartbeat_ack")
    capabilities = created["session"]["capabilities"]
    assert capabilities["implementation_level"] == "model_native_duplex"
    assert capabilities["input_modes"] == ["append_audio_chunk"]
    assert capabilities["supports_multi_session"] is True
    assert capabilities["supports_multi_session_same_replica"] is True
    assert capabilities["supports_playback_ack"] is True
    assert added["item"]["role"] == "user" and added["item"]["content"][0]["text"] == "turn left"
    assert alias["item"]["content"][0]["text"] == "then stop"
    assert cleared["epoch"] == epoch_before and after["epoch"] == epoch_before + 1  # the cancel advanced it


async def test_declared_silence_commit_is_answered_by_response_listen(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, websockets.connect(ws_url(base, duplex="1")) as ws:
        created = await next_of(ws, "session.created")
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "is_speech": False, "event_id": "s1"}))
        listen = await next_of(ws, "response.listen")
        await ws.send(json.dumps({"type": "session.heartbeat"}))
        seen = []
        while (event := json.loads(await asyncio.wait_for(ws.recv(), HANG_GUARD_S)))["type"] != "session.heartbeat_ack":
            seen.append(event)
    assert listen["session_id"] == created["session"]["id"]
    assert listen["response"] == {"status": "listening", "metadata": {"reason": "silence_declared"}}
    assert "error" not in [e["type"] for e in seen]


async def test_native_duplex_query_is_met_or_refused(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base:
        async with websockets.connect(ws_url(base, duplex="1", native_duplex="1")) as ws:
            created = await next_of(ws, "session.created")
        async with websockets.connect(ws_url(base, duplex="1", minicpmo45_native_duplex="false")) as ws:
            error = json.loads(await asyncio.wait_for(ws.recv(), HANG_GUARD_S))
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), HANG_GUARD_S)
    assert created["session"]["capabilities"]["implementation_level"] == "model_native_duplex"
    assert error["type"] == "error" and error["error"]["code"] == "native_duplex_unavailable"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_runtime_control_reports_what_a_control_signal_did(config: ServerConfig) -> None:
    """``runtime.control``: unasked when the engine honours a signal only in part (a lockstep
    stream cannot be stopped), after every signal once ``extra_body.emit_duplex_control_results``."""
    async with running(loopback_config(config)) as base, websockets.connect(ws_url(base, duplex="1")) as ws:
        await next_of(ws, "session.created")
        await ws.send(json.dumps({"type": "output_audio_buffer.clear", "event_id": "x1"}))
        partial = await next_of(ws, "runtime.control")
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        await ws.send(json.dumps({"type": "session.heartbeat"}))
        quiet = []
        while (event := json.loads(await asyncio.wait_for(ws.recv(), HANG_GUARD_S)))["type"] != "session.heartbeat_ack":
            quiet.append(event["type"])
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "event_id": "u1",
                    "session": {"extra_body": {"emit_duplex_control_results": "yes"}},
                }
            )
        )
        refused = await next_of(ws, "error")
        await ws.send(
            json.dumps({"type": "session.update", "session": {"extra_body": {"emit_duplex_control_results": True}}})
        )
        await next_of(ws, "session.updated")
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        asked = await next_of(ws, "runtime.control")
    assert partial["result"] == {
        "signal": "clear_output",
        "ok": False,
        "applied": ["epoch_advanced"],
        "unsupported": ["stop_output"],
    }
    assert partial["epoch"] == 1 and partial["session_id"]
    assert "input_audio_buffer.cleared" in quiet and "runtime.control" not in quiet  # honoured in full: unasked
    assert (refused["error"]["code"], refused["error"]["param"], refused["error"]["event_id"]) == (
        "invalid_event",
        "session.extra_body.emit_duplex_control_results",
        "u1",
    )
    assert asked["result"] == {"signal": "clear_input", "ok": True, "applied": ["input_cleared"], "unsupported": []}
