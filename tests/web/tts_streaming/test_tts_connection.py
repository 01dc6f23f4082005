"""``TTSConnection`` against a socket that stops taking bytes (docs/serving.md#tts-streaming): the
stalled send ends the stream with ``output_backpressure`` after ``send_timeout_s``, a full queue of
``max_queued_messages`` stops taking the stream's events (the engine holds the row back), and the
slot is released either way; audio goes out at most ``max_audio_ahead_s`` ahead of real time.
Doubles stand in for the socket and the engine stream so the stall is exact, not a race with the
kernel's buffers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, cast

import msgpack
import numpy as np
from aiohttp import web

from rtserve.engines.kyutai_tts.stream import SpeechAudio, SpeechEvent, TTSStream
from rtserve.web.tts_streaming.connection import TTSConnection
from rtserve.web.tts_streaming.wire import OutputFormat


class StallingSocket:
    """Takes ``accept`` messages, then never completes another send; the client sends nothing."""

    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.sent: list[bytes] = []
        self.sent_at: list[float] = []  # the loop's clock at each send
        self.closed: tuple[int, bytes] | None = None
        self._never = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        if len(self.sent) >= self.accept:
            await self._never.wait()
        self.sent.append(data)
        self.sent_at.append(asyncio.get_running_loop().time())

    async def receive(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109 - aiohttp's signature
        await self._never.wait()

    async def close(self, *, code: int, message: bytes) -> bool:
        self.closed = (code, message)
        return True


class FrameStream:
    """Speaks ``frames`` audio frames as fast as they are taken."""

    def __init__(self, frames: int) -> None:
        self.frames = frames
        self.ended = True
        self.released = False
        self.taken = 0

    async def events(self) -> AsyncGenerator[SpeechEvent, None]:
        for _ in range(self.frames):
            self.taken += 1
            yield SpeechAudio(np.zeros(1920, np.float32))
            await asyncio.sleep(0)

    async def close(self) -> None:
        self.released = True


def _connection(
    ws: StallingSocket, stream: FrameStream, *, queued: int, send_timeout_s: float = 0.2, audio_ahead_s: float = 60.0
) -> TTSConnection:
    return TTSConnection(
        cast(web.WebSocketResponse, ws),
        cast(TTSStream, stream),
        OutputFormat.PCM_MESSAGE_PACK,
        max_message_bytes=1024,
        idle_timeout_s=30.0,
        send_timeout_s=send_timeout_s,
        max_queued_messages=queued,
        max_audio_ahead_s=audio_ahead_s,
        sample_rate=24000,
    )


async def test_a_send_that_takes_no_bytes_ends_the_stream() -> None:
    ws, stream = StallingSocket(accept=3), FrameStream(frames=20)
    await asyncio.wait_for(_connection(ws, stream, queued=64).run(), 5)
    assert stream.released
    assert ws.closed is not None and ws.closed[0] == 1008 and ws.closed[1].startswith(b"output_backpressure")
    assert msgpack.unpackb(ws.sent[0]) == {"type": "Ready"}


async def test_a_full_queue_stops_taking_events_until_the_stalled_send_ends_the_stream() -> None:
    ws, stream = StallingSocket(accept=1), FrameStream(frames=100)
    await asyncio.wait_for(_connection(ws, stream, queued=16, send_timeout_s=0.3).run(), 5)
    # Ready was sent, one frame is stuck in the send, 16 queued, one waits for room: no more taken.
    assert stream.taken == 18
    assert stream.released and ws.closed is not None and ws.closed[1].startswith(b"output_backpressure")


async def test_a_reader_that_keeps_up_gets_every_frame_then_a_normal_close() -> None:
    ws, stream = StallingSocket(accept=1000), FrameStream(frames=20)
    await asyncio.wait_for(_connection(ws, stream, queued=16).run(), 5)
    kinds = [msgpack.unpackb(data)["type"] for data in ws.sent]
    assert kinds == ["Ready"] + ["Audio"] * 20
    assert ws.closed is not None and ws.closed[0] == 1000 and stream.released


async def test_audio_goes_out_no_further_ahead_of_real_time_than_the_bound() -> None:
    """A client reading at playback pace meets what was sent ahead of it only that much later
    (its close frame, an ``Error``): audio made faster than real time goes out at most
    ``max_audio_ahead_s`` ahead of the time since the first frame, here 0.4 s of 2 s."""
    ws, stream = StallingSocket(accept=1000), FrameStream(frames=25)
    await asyncio.wait_for(_connection(ws, stream, queued=64, audio_ahead_s=0.4).run(), 10)
    first = ws.sent_at[1]  # after Ready
    ahead = [(i + 1) * 0.08 - (at - first) for i, at in enumerate(ws.sent_at[1:])]
    assert len(ahead) == 25 and max(ahead) <= 0.4 + 0.08 + 0.05  # a frame's worth over the bound at most
    assert ws.sent_at[-1] - first >= 2.0 - 0.4 - 0.08 - 0.05  # real time, not as fast as made
    assert ws.closed is not None and ws.closed[0] == 1000
