"""A duplex realtime client that streams 80 ms frames and counts what comes back."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable

import aiohttp
import numpy as np

FRAME = 1920  # 80 ms at 24 kHz


class DuplexClient:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, first: dict) -> None:
        self.ws = ws
        self.first = first  # session.created, or the error that refused the session
        self.echoes = 0
        self.errors: list[dict] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def admitted(self) -> bool:
        return self.first["type"] == "session.created"

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

    async def close(self) -> None:
        await self.ws.close()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def echoes_grow(self, seconds: float) -> int:
        before = self.echoes
        await asyncio.sleep(seconds)
        return self.echoes - before


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
