"""The ``oai-events`` data channel of a call: the events half of its ``CallTransport``
(``events.py``), over an aiortc ``RTCDataChannel``, so a WebRTC call runs the exact event
handling of ``/v1/realtime``.

* Receiving: aiortc hands over messages by callback, as fast as the peer sends; at most
  ``webrtc.max_pending_events`` wait for the connection, and one beyond is dropped and
  reported (``on_overflow``: the call answers ``input_backpressure``).
* Sending waits until the peer has opened the channel (the session exists before ICE has
  connected), and while more than ``webrtc.data_channel_buffer_bytes`` are unsent, so a
  peer that stops reading backs up into the session's bounded output buffer.
* A call whose offer had no data channel section (``m=application``) has no channel ever:
  events are discarded instead of waited for.
* ``send_now`` sends at once (the track's small ``output_audio_buffer.*`` notices, which
  must not wait behind the event stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from aiohttp import WSMessage, WSMsgType
from aiortc import RTCDataChannel

from rtserve import untrusted_json

log = logging.getLogger(__name__)

EVENTS_LABEL = "oai-events"
_CLOSED = WSMessage(WSMsgType.CLOSED, None, None)


class DataChannelSocket:
    def __init__(
        self,
        *,
        expects_channel: bool,
        max_pending: int,
        max_buffered_bytes: int,
        on_overflow: Callable[[], None],
        on_client_event: Callable[[str], bool],
    ) -> None:
        self._expects_channel = expects_channel
        self._max_pending = max_pending
        self._max_buffered = max_buffered_bytes
        self._on_overflow = on_overflow
        self._on_client_event = on_client_event  # True: the call handled it (a WebRTC-only event)
        self._channel: RTCDataChannel | None = None
        self._inbox: deque[WSMessage] = deque()
        self._arrived = asyncio.Event()
        self._usable = asyncio.Event()  # open (or never coming), or closed
        self._drained = asyncio.Event()
        self._drained.set()
        self._closed = False
        if not expects_channel:
            self._usable.set()

    # ---------------------------------------------------------------- binding

    def bind(self, channel: RTCDataChannel, on_peer_close: Callable[[], None]) -> bool:
        """Adopt the peer's ``oai-events`` channel; False for any other (ignored) channel."""
        if channel.label != EVENTS_LABEL or self._channel is not None or self._closed:
            return False
        self._channel = channel
        channel.bufferedAmountLowThreshold = self._max_buffered // 2
        channel.on("message", self._on_message)
        channel.on("bufferedamountlow", self._drained.set)
        channel.on("close", lambda: None if self._closed else on_peer_close())  # not our own close
        if channel.readyState == "open":
            self._usable.set()
        else:
            channel.on("open", self._usable.set)
        return True

    @property
    def bound(self) -> bool:
        return self._channel is not None

    def _on_message(self, data: str | bytes) -> None:
        if self._closed:
            return
        if isinstance(data, str) and self._on_client_event(data):
            return
        if len(self._inbox) >= self._max_pending:
            self._on_overflow()
            return
        kind = WSMsgType.TEXT if isinstance(data, str) else WSMsgType.BINARY
        self._inbox.append(WSMessage(kind, data, None))
        self._arrived.set()

    # ---------------------------------------------------------------- events in and out

    @property
    def closed(self) -> bool:
        return self._closed

    async def receive(self) -> WSMessage:
        while not self._inbox:
            if self._closed:
                return _CLOSED
            self._arrived.clear()
            await self._arrived.wait()
        return self._inbox.popleft()

    async def send_str(self, text: str) -> None:
        await self._usable.wait()
        channel = self._channel
        if self._closed:
            raise ConnectionResetError("the call has ended")
        if channel is None:  # no data channel was negotiated: nobody receives events
            return
        while channel.bufferedAmount > self._max_buffered:
            self._drained.clear()
            await self._drained.wait()
            if self._closed:
                raise ConnectionResetError("the call has ended")
        self._send(channel, text)

    def send_now(self, text: str) -> None:
        if self._channel is not None and self._usable.is_set() and not self._closed:
            self._send(self._channel, text)

    def _send(self, channel: RTCDataChannel, text: str) -> None:
        if channel.readyState != "open":
            raise ConnectionResetError("the data channel is closed")
        channel.send(text)

    async def close(self) -> None:
        """End the channel (the connection's close after the session's last event, or the call's end)."""
        if self._closed:
            return
        self._closed = True
        for event in (self._arrived, self._usable, self._drained):
            event.set()
        if self._channel is not None:
            self._channel.close()


def client_event_type(text: str) -> str | None:
    """The ``type`` of a small client event (large ones are audio appends: not parsed twice)."""
    if len(text) > 4096:
        return None
    try:
        data = untrusted_json.loads(text)
    except ValueError:
        return None
    return data.get("type") if isinstance(data, dict) else None
