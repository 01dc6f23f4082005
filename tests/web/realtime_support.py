"""Support for the realtime route tests: a loopback server on 127.0.0.1, raw WebSocket
helpers, and the official SDK's own event types to validate what the server sends.

The loopback engine returns each session's input one 80 ms frame later (silence before
that, and whenever the client sends nothing), so a test recognises its audio bit for bit.
Real-time bounds only guard against a hung test; nothing asserts on timing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import typing
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.protocols import HostedSessionEngine
from tests.support import serve_app

HANG_GUARD_S = 15.0
FRAME = 1920  # 80 ms at 24 kHz: one loopback frame
SDK_EVENTS: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
SDK_EVENT_TYPES = frozenset(
    typing.get_args(model.model_fields["type"].annotation)[0]
    for model in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
)


def loopback_config(config: ServerConfig, **sessions: Any) -> ServerConfig:
    config.engine = "loopback"
    config.lockstep.batch_size = 8
    for key, value in sessions.items():
        setattr(config.sessions, key, value)
    return config


@contextlib.asynccontextmanager
async def running(
    config: ServerConfig, *, ready_timeout_s: float = HANG_GUARD_S, engine: HostedSessionEngine | None = None
) -> AsyncIterator[str]:
    """The app on a real socket (around ``engine`` when given), engine ready; yields its http:// base URL."""
    async with serve_app(build_app(config, engine=engine)) as base, aiohttp.ClientSession() as http:
        await until_ready(http, base, ready_timeout_s)
        yield base


async def until_ready(http: aiohttp.ClientSession, base: str, timeout_s: float = HANG_GUARD_S) -> None:
    """Until ``/health`` says ready (bounded: the load may fail, or hang)."""
    for _ in range(int(timeout_s * 20)):
        async with http.get(f"{base}/health") as resp:
            if resp.status == 200:
                return
            body = await resp.json()
            assert body.get("status") != "failed", body
        await asyncio.sleep(0.05)


def ws_url(base: str, path: str = "/v1/realtime", **query: str) -> str:
    url = base.replace("http://", "ws://") + path
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


async def close_code(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    """Drain events until the server closes the socket; the code in its close frame."""
    await read_to_close(ws)
    return closing_codes.get(ws)


def pcm16_b64(samples: np.ndarray) -> str:
    return base64.b64encode(np.asarray(samples, dtype="<i2").tobytes()).decode()


def b64_pcm16(payload: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(payload), dtype="<i2")


def tagged_frame(tag: int) -> np.ndarray:
    """A frame of PCM16 recognisable after the loopback: its first samples spell ``tag``."""
    frame = np.full(FRAME, 1000, dtype=np.int16)
    frame[:4] = [tag & 0x7FFF, (tag >> 15) & 0x7FFF, 4242, -4242]
    return frame


def frame_tag(frame: np.ndarray) -> int | None:
    if len(frame) < 4 or frame[2] != 4242 or frame[3] != -4242:
        return None
    return int(frame[0]) | (int(frame[1]) << 15)


def echoed_tags(events: list[dict[str, Any]]) -> list[int]:
    tags = []
    for event in events:
        if event["type"] == "response.output_audio.delta":
            tag = frame_tag(b64_pcm16(event["delta"]))
            if tag is not None:
                tags.append(tag)
    return tags


async def receive_event(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any] | None:
    """The next JSON event, or None once the server closed the socket (its close code is
    then in ``closing_codes[ws]``)."""
    message = await asyncio.wait_for(ws.receive(), HANG_GUARD_S)
    if message.type is aiohttp.WSMsgType.TEXT:
        return json.loads(message.data)
    assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED), message
    closing_codes[ws] = int(message.data) if message.type is aiohttp.WSMsgType.CLOSE else ws.close_code
    return None


# The code of the server's close frame, per socket (aiohttp's close_code can read 1006 after
# its own close reply raced the server's transport close).
closing_codes: weakref.WeakKeyDictionary[aiohttp.ClientWebSocketResponse, int | None] = weakref.WeakKeyDictionary()


async def read_until(
    ws: aiohttp.ClientWebSocketResponse, match: str | Callable[[dict[str, Any]], bool], *, limit: int = 2000
) -> list[dict[str, Any]]:
    """Events up to and including the first one whose type is ``match`` (or that ``match`` accepts)."""
    accept = (lambda e: e["type"] == match) if isinstance(match, str) else match
    seen: list[dict[str, Any]] = []
    for _ in range(limit):
        event = await receive_event(ws)
        assert event is not None, f"socket closed before {match}: {[e['type'] for e in seen][-20:]}"
        seen.append(event)
        if accept(event):
            return seen
    raise AssertionError(f"no {match} in {limit} events")


async def read_to_close(ws: aiohttp.ClientWebSocketResponse, *, limit: int = 5000) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for _ in range(limit):
        event = await receive_event(ws)
        if event is None:
            return seen
        seen.append(event)
    raise AssertionError("the server did not close the socket")


def audio_of(events: list[dict[str, Any]]) -> np.ndarray:
    deltas = [
        b64_pcm16(e["delta"]) for e in events if e["type"] in ("response.output_audio.delta", "response.audio.delta")
    ]
    return np.concatenate(deltas) if deltas else np.zeros(0, np.int16)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]
