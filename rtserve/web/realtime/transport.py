"""What a realtime connection (``connection.py``) needs of the transport under it.

The same event handling serves ``/v1/realtime`` over a WebSocket (``WebSocketTransport``)
and a WebRTC call over its ``oai-events`` data channel and media track
(``web/webrtc/events.py``). The two differ in where agent audio goes and in whether the
server still holds audio that an interruption must cut off: a WebSocket client plays what it
received, a call's track plays what the server queued.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from aiohttp import WSMessage, web

from rtserve.sessions import Delivery
from rtserve.web.connections import close_socket


@dataclass(frozen=True)
class CutOff:
    """A response whose queued audio an interruption dropped, and how much of it was heard."""

    response_id: str
    heard_ms: int


class EventTransport(Protocol):
    @property
    def closed(self) -> bool: ...

    async def receive(self) -> WSMessage:
        """The client's next message (a CLOSE, CLOSED or ERROR one ends the connection)."""
        ...

    async def send_text(self, text: str) -> None:
        """An event the connection writes itself (an error before any session, ``conversation.created``)."""
        ...

    async def deliver(self, delivery: Delivery) -> None:
        """One event of the session's stream."""
        ...

    async def interrupt_playback(self) -> list[CutOff]:
        """Drop the agent audio this transport still holds (the user spoke over it, or asked
        to clear it); the responses that lost audio, each once."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close with a WebSocket close code; a transport already gone is not an error."""
        ...

    def abort(self) -> None:
        """Drop the connection at once: the peer stopped reading, and unsent bytes would keep it open."""
        ...


class WebSocketTransport:
    """A ``/v1/realtime`` WebSocket: every event goes out as its JSON text."""

    def __init__(self, ws: web.WebSocketResponse, connection: asyncio.Transport | None) -> None:
        self.ws = ws
        self._connection = connection  # the TCP transport under the socket (None once the request is gone)

    @property
    def closed(self) -> bool:
        return self.ws.closed

    async def receive(self) -> WSMessage:
        return await self.ws.receive()

    async def send_text(self, text: str) -> None:
        await self.ws.send_str(text)

    async def deliver(self, delivery: Delivery) -> None:
        await self.ws.send_str(delivery.text)

    async def interrupt_playback(self) -> list[CutOff]:
        return []  # the client plays the audio it received and truncates its own items

    async def close(self, code: int, reason: str) -> None:
        await close_socket(self.ws, code, reason)

    def abort(self) -> None:
        if self._connection is not None:
            self._connection.abort()
