"""A duplex realtime client that streams 80 ms frames and counts what comes back."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import numpy as np

from tests.web.realtime_support import (
    echoed_tags,
    pcm16_b64,
    read_to_close,
    read_until,
    receive_event,
    tagged_frame,
    ws_url,
)

FRAME = 1920  # 80 ms at 24 kHz


class DuplexClient:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, first: dict) -> None:
        self.ws = ws
        self.first = first  # session.created, or the error that refused the session
        self.echoes = 0
        self.errors: list[dict] = []
        self.closed = asyncio.Event()  # set once its socket has ended
        self._task: asyncio.Task[None] | None = None

    @property
    def admitted(self) -> bool:
        return self.first["type"] == "session.created"

    @property
    def worker(self) -> str:
        """The front-end worker that took the socket (``X-Rtserve-Worker``: "index:pid")."""
        return self.ws._response.headers["X-Rtserve-Worker"]

    @property
    def worker_pid(self) -> int:
        return int(self.worker.split(":")[1])

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        frame = base64.b64encode(np.full(FRAME, 1000, np.int16).tobytes()).decode()

        async def send() -> None:
            while not self.ws.closed:
                await self.ws.send_str(json.dumps({"type": "input_audio_buffer.append", "audio": frame}))
                await asyncio.sleep(0.08)

        sender = asyncio.create_task(send())
        try:
            async for message in self.ws:
                if message.type is not aiohttp.WSMsgType.TEXT:
                    break
                event = json.loads(message.data)
                if event["type"] == "response.output_audio.delta":
                    self.echoes += 1
                elif event["type"] == "error":
                    self.errors.append(event["error"])
        except (aiohttp.ClientError, ConnectionError):
            pass
        finally:
            sender.cancel()
            self.closed.set()

    async def close(self) -> None:
        await self.ws.close()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def end(self) -> None:
        """End the session itself (a dropped duplex socket leaves it waiting for a resume)."""
        await self.ws.send_json({"type": "session.close"})
        if self._task is not None:
            await asyncio.wait_for(asyncio.gather(self._task, return_exceptions=True), 30)


class CountsEchoes(Protocol):
    echoes: int


async def echoes_over(client: CountsEchoes, seconds: float) -> int:
    """Echoes ``client`` receives over the next ``seconds`` (a rate: its session is not stalled)."""
    before = client.echoes
    await asyncio.sleep(seconds)
    return client.echoes - before


async def echoes_again(client: CountsEchoes, within_s: float = 10.0) -> bool:
    """Whether another echo reaches ``client`` within ``within_s``, returning at the first (its
    session is live). A fixed half-second window failed on a loaded 2-core machine."""
    before = client.echoes
    deadline = time.monotonic() + within_s
    while client.echoes == before:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def open_session(http: aiohttp.ClientSession, base: str) -> DuplexClient:
    ws = await http.ws_connect(f"{base}/v1/realtime?duplex=1")
    client = DuplexClient(ws, json.loads((await ws.receive(timeout=30)).data))
    if client.admitted:
        client.start()
    else:
        await ws.close()
    return client


async def eventually(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@dataclass
class Resumed:
    created: dict  # session.created on the front-end that admitted the session
    last_seq: int  # the last event the client read before dropping the socket
    resumed: dict  # session.resumed on the other one
    replayed: list[dict]  # what came after it, up to the echo of the frames sent while detached
    flowing: list[dict]  # events up to the echo of a frame sent on the resumed socket


async def drop_and_resume(
    http: aiohttp.ClientSession,
    owner_base: str,
    connect_elsewhere: Callable[[aiohttp.ClientWebSocketResponse], Awaitable[aiohttp.ClientWebSocketResponse]],
) -> Resumed:
    """Open a duplex session on ``owner_base``, send three tagged frames, drop the socket (their
    echoes go only to the journal), resume on the socket ``connect_elsewhere(first_socket)``
    opens (on another front-end) and send one more frame there."""
    first = await http.ws_connect(ws_url(owner_base, duplex="1"))
    created = await receive_event(first)
    assert created is not None and created["type"] == "session.created", created
    seen = await read_until(first, "response.output_audio.delta")
    for tag in (11, 12, 13):
        await first.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(tag))})
    await first.close()
    async with await connect_elsewhere(first) as second:
        await second.send_json(
            {
                "type": "session.resume",
                "event_id": "resume-elsewhere",
                "session_id": created["session"]["id"],
                "resume_token": created["resume_token"],
                "attachment_generation": 0,
                "last_received_server_event_seq": seen[-1]["server_event_seq"],
            }
        )
        resumed = await receive_event(second)
        assert resumed is not None
        if resumed["type"] != "session.resumed":
            return Resumed(created, seen[-1]["server_event_seq"], resumed, [], [])
        replayed = await read_until(second, lambda e: 13 in echoed_tags([e]))
        await second.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(21))})
        flowing = await read_until(second, lambda e: 21 in echoed_tags([e]))
        await second.send_json({"type": "session.close"})
        await read_to_close(second)
    return Resumed(created, seen[-1]["server_event_seq"], resumed, replayed, flowing)
