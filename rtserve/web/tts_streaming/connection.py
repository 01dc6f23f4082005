"""One ``WS /api/tts_streaming`` connection: three tasks around one ``SpeechStream``
(docs/serving.md#tts-streaming).

* the reader takes client messages: text goes to the stream (bounded backlog), ``Eos`` ends it;
  a message over ``max_message_bytes``, garbage, a second ``Eos`` or text after it, or silence
  for ``idle_timeout_s`` before the ``Eos`` end the connection with a typed ``Error``;
* the producer turns the stream's words and audio frames into wire messages, in order, on a
  bounded queue (``max_queued_messages``), the audio at most ``max_audio_ahead_s`` ahead of real
  time (``engines/audio_pace.py``); when it waits, the engine, which makes audio ahead of
  playback while the stream's reader has room, holds this row back;
* the sender writes them; a send that takes no bytes for ``send_timeout_s`` ends the connection.

The first task to fail decides the ending: ``Error`` (with its code) then close, or, once the
speech is done and sent, a normal close. The stream's slot is released in every case.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
from aiohttp import WSCloseCode, WSMsgType, web

from rtserve.codecs.oggopus import OggOpusWriter
from rtserve.engines.audio_pace import AudioPace
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.service import SpeechStream
from rtserve.engines.kyutai_tts.stream import SpeechAudio
from rtserve.errors import (
    OUTPUT_BACKPRESSURE,
    REQUEST_TOO_LARGE,
    SESSION_IDLE_TIMEOUT,
    RtserveError,
)
from rtserve.web.connections import close_socket
from rtserve.web.tts_streaming import wire
from rtserve.web.tts_streaming.wire import EosIn, OutputFormat, TextIn

log = logging.getLogger(__name__)

_ERROR_SEND_TIMEOUT_S = 1.0  # the Error message is best effort: a stalled reader gets the close


class TTSConnection:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        stream: SpeechStream,
        output: OutputFormat,
        *,
        max_message_bytes: int,
        idle_timeout_s: float,
        send_timeout_s: float,
        max_queued_messages: int,
        max_audio_ahead_s: float,
        sample_rate: int,
    ) -> None:
        self._ws = ws
        self._stream = stream
        self._output = output
        self._max_message_bytes = max_message_bytes
        self._idle_timeout_s = idle_timeout_s
        self._send_timeout_s = send_timeout_s
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(max_queued_messages)
        self._max_audio_ahead_s = max_audio_ahead_s
        self._sample_rate = sample_rate
        self._ogg = OggOpusWriter(sample_rate) if output is OutputFormat.OGG_OPUS else None

    async def run(self) -> None:
        """Serve until the speech is sent, the client leaves, or an error ends it."""
        if self._ogg is None:
            self._enqueue(wire.ready())
        else:
            self._enqueue(self._ogg.write(np.zeros(0, np.float32)))  # the Ogg-Opus headers, at once
        reader = asyncio.create_task(self._read(), name="tts-read")
        sender = asyncio.create_task(self._send(), name="tts-send")
        tasks = {reader, sender, asyncio.create_task(self._produce(), name="tts-produce")}
        failure: RtserveError | None = None
        try:
            pending = set(tasks)
            while failure is None and reader in pending and sender in pending:
                # Ends when the sender sent everything, the client left, or a task failed.
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, RtserveError):
                        failure = exc
                    elif exc is not None:
                        raise exc
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._stream.close()
        if failure is not None:
            await self._fail(failure)
        else:
            await close_socket(self._ws, WSCloseCode.OK, "")

    async def _read(self) -> None:
        ws, stream = self._ws, self._stream
        while True:
            try:
                message = await ws.receive(timeout=None if stream.ended else self._idle_timeout_s)
            except TimeoutError:
                raise EngineError(
                    f"no message for {self._idle_timeout_s:g} s before the end of stream", code=SESSION_IDLE_TIMEOUT
                ) from None
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                return
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue  # pings and pongs
            text = message.type is WSMsgType.TEXT  # moshi-server speaks a text message too
            if len(message.data.encode() if text else message.data) > self._max_message_bytes:
                raise EngineError(f"a message is limited to {self._max_message_bytes} bytes", code=REQUEST_TOO_LARGE)
            parsed = TextIn(message.data) if text else wire.parse_binary(message.data)
            if isinstance(parsed, EosIn):
                stream.end()
            else:
                stream.send_text(parsed.text)

    async def _produce(self) -> None:
        pace = AudioPace(self._max_audio_ahead_s, self._sample_rate)
        async for event in self._stream.events():
            if isinstance(event, SpeechAudio):
                await pace.hold(event.pcm.size)
                await self._put(wire.audio(event.pcm) if self._ogg is None else self._ogg.write(event.pcm))
            elif self._ogg is None:
                await self._put(wire.word(event.text, event.start_s, event.stop_s))
        if self._ogg is not None:
            await self._put(self._ogg.close())
        await self._queue.put(None)

    async def _put(self, data: bytes) -> None:
        """Queue a message, waiting while the queue is full (a stalled reader is the sender's to end)."""
        if data:
            await self._queue.put(data)

    def _enqueue(self, data: bytes) -> None:
        """The first message, on the empty queue."""
        if data:
            self._queue.put_nowait(data)

    async def _send(self) -> None:
        while (data := await self._queue.get()) is not None:
            try:
                async with asyncio.timeout(self._send_timeout_s):  # not wait_for: see asr_streaming._write
                    await self._ws.send_bytes(data)
            except TimeoutError:
                raise EngineError(
                    f"the client took no audio for {self._send_timeout_s:g} s", code=OUTPUT_BACKPRESSURE
                ) from None

    async def _fail(self, exc: RtserveError) -> None:
        log.info("tts stream ended: %s (%s)", exc.message, exc.code)
        if self._ogg is None:
            with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                await asyncio.wait_for(self._ws.send_bytes(wire.error(exc)), _ERROR_SEND_TIMEOUT_S)
        with contextlib.suppress(TimeoutError):  # a stalled reader may not take the close frame either
            await asyncio.wait_for(
                close_socket(self._ws, wire.close_code_for(exc), f"{exc.code}: {exc.message}"), _ERROR_SEND_TIMEOUT_S
            )
