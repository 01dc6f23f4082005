"""Deadlines that free a Moshi connection's engine slot when its client stops taking part.

* Receive: the next message that counts (audio on a live conversation, ``open`` on a fresh
  ``/v1/audio/duplex`` socket) must arrive by a deadline; other messages do not move it, so
  a client cannot hold a slot with unknown tags or pings. Past it, the socket is closed
  with 1000 and the deadline's reason (as the openpi route does for an idle robot).
* Send: a write the reader has not taken within ``moshi.send_timeout_s`` (a frame, ``done``
  or the close frame stuck behind a full send buffer) drops the connection: a graceful
  close would wait on that same buffer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from aiohttp import WSCloseCode, WSMessage, web

from rtserve.web.connections import close_socket

log = logging.getLogger(__name__)


@dataclass
class ReceiveDeadline:
    at: float  # the event loop's clock
    reason: str  # the close reason when it passes

    @classmethod
    def after(cls, timeout_s: float, reason: str) -> ReceiveDeadline:
        return cls(asyncio.get_running_loop().time() + timeout_s, reason)


async def receive_before(
    ws: web.WebSocketResponse, deadline: ReceiveDeadline, transport: asyncio.Transport | None, send_timeout_s: float
) -> WSMessage | None:
    """The next client message, or ``None`` once ``deadline`` passed and ``ws`` was closed."""
    try:
        async with asyncio.timeout_at(deadline.at):
            return await ws.receive()
    except TimeoutError:
        log.info("closing: %s", deadline.reason)
        await close_within(ws, transport, WSCloseCode.OK, deadline.reason, send_timeout_s)
        return None


async def send_within(send: Awaitable[None], transport: asyncio.Transport | None, timeout_s: float) -> bool:
    """Await ``send``; False (and the connection dropped) when the reader stalled past ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            await send
    except TimeoutError:
        log.info("dropping the connection: its reader took nothing for %.1f s", timeout_s)
        if transport is not None:
            transport.abort()
        return False
    return True


async def close_within(
    ws: web.WebSocketResponse, transport: asyncio.Transport | None, code: int, reason: str, timeout_s: float
) -> None:
    """``close_socket``, dropping the connection when the close frame cannot be sent in time."""
    await send_within(close_socket(ws, code, reason), transport, timeout_s)
