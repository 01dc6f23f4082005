"""Realtime replies spoken by a TTS server over moshi-server's protocol (``cascade.tts:
tts_server``; docs/engines.md#a-tts-server-in-the-cascade).

The server is another rtserve's ``WS /api/tts_streaming`` (its own engine process, GPU and
interpreter) or Kyutai's moshi-server: each reply opens one WebSocket
(``?voice=...&format=PcmMessagePack``, the ``kyutai-api-key`` header), waits for ``Ready``, sends
its words as ``Text`` messages and ``Eos``, and reads ``Text`` (a word with its times) and
``Audio`` (float32 PCM at 24 kHz) until the server closes. This is how Kyutai's own voice agent
(Unmute) reaches its TTS; here it puts the TTS in a process, or on a GPU or host, of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgpack
import numpy as np

from rtserve.config import TTSServerConfig
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.kyutai_tts.stream import SpeechAudio, SpeechEvent, SpokenWord
from rtserve.engines.voice_names import OPENAI_VOICES
from rtserve.errors import (
    ENGINE_UNAVAILABLE,
    INPUT_BACKPRESSURE,
    RESOURCE_EXHAUSTED,
    STREAM_ALREADY_ENDED,
    VOICE_NOT_FOUND,
)

SAMPLE_RATE = 24_000  # the protocol's PCM rate
# The server's error codes passed on as they are (an rtserve server sends these); any other
# refusal, or a moshi-server's (which sends no code), is an engine error.
_KNOWN_CODES = frozenset({VOICE_NOT_FOUND, INPUT_BACKPRESSURE, ENGINE_UNAVAILABLE})
_EOS = {"type": "Eos"}
STARTUP_POLL_S = 1.0  # how often the startup wait asks a server that is not serving yet


class TTSServerRefused(EngineError):
    """The server answered and said no to the connection itself (a wrong key or path): asking
    again will not help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ENGINE_UNAVAILABLE)


class TTSServerStreams:
    """A ``SpeechStreams`` whose streams live on a TTS server."""

    sample_rate = SAMPLE_RATE

    def __init__(self, config: TTSServerConfig) -> None:
        self._config = config
        self._http: aiohttp.ClientSession | None = None  # made on the loop that first opens a stream

    async def wait_served(self) -> None:
        """Until the server serves (a stream is opened and closed at once), at most
        ``startup_timeout_s``: a server still starting refuses connections, and an rtserve answers
        ``engine_unavailable`` while its engine loads. A full server serves, and so does one that
        answers this stream (which names no voice) with another refusal of its protocol. Raises
        the refusal of a server that says no to the connection itself, and ``EngineError`` once
        the time is up."""
        config = self._config
        deadline = time.monotonic() + config.startup_timeout_s
        while True:
            try:
                await (await self.open_stream("startup", None)).close()
                return
            except CapacityExhausted:
                return
            except TTSServerRefused:
                raise
            except EngineError as exc:
                if exc.code != ENGINE_UNAVAILABLE:  # e.g. no default voice: its engine answered
                    return
                problem = exc.message
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(
                    f"the TTS server at {config.url} did not serve within "
                    f"cascade.tts_server.startup_timeout_s={config.startup_timeout_s:g} ({problem})",
                    code=ENGINE_UNAVAILABLE,
                )
            await asyncio.sleep(min(STARTUP_POLL_S, left))

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> TTSServerStream:
        """Connected and ``Ready``; ``CapacityExhausted`` when the server has no free channel,
        ``EngineError`` when it refuses or cannot be reached. ``stream_id`` names it in logs only.
        OpenAI's built-in voice names (what clients send by default) ask for the server's default
        voice, as they do of the in-process engine: a moshi-server knows none of them."""
        if voice in OPENAI_VOICES:
            voice = None
        query = {"format": "PcmMessagePack"} | ({"voice": voice} if voice else {})
        if seed is not None:
            query["seed"] = str(seed)
        headers = {"kyutai-api-key": self._config.api_key} if self._config.api_key else {}
        if self._http is None:
            self._http = aiohttp.ClientSession(
                # The handshake's deadline (a stream's reads have their own); no cap on open
                # connections here: the server's channels are the bound (aiohttp's default is 100).
                timeout=aiohttp.ClientTimeout(total=self._config.connect_timeout_s),
                connector=aiohttp.TCPConnector(limit=0),
            )
        try:
            ws = await self._http.ws_connect(
                f"{self._config.url}?{urlencode(query)}",
                headers=headers,
                max_msg_size=self._config.max_message_bytes,
                # A barge-in closes the socket: a server that does not answer the close holds it this long at most.
                timeout=aiohttp.ClientWSTimeout(ws_close=self._config.connect_timeout_s),
            )
        except aiohttp.WSServerHandshakeError as exc:  # answered, but not upgraded: a wrong key, a wrong path
            raise TTSServerRefused(
                f"the TTS server at {self._config.url} refused the connection (HTTP {exc.status})"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise EngineError(
                f"the TTS server at {self._config.url} cannot be reached ({type(exc).__name__})",
                code=ENGINE_UNAVAILABLE,
            ) from None
        try:
            first = await _receive(ws, self._config.connect_timeout_s)
            if isinstance(first, _Closed):  # an rtserve refuses a wrong key so, after the upgrade
                raise TTSServerRefused(f"the TTS server closed the connection before Ready (close code {first.code})")
            if first.get("type") != "Ready":
                raise _refusal(first)
        except BaseException:
            await ws.close()
            raise
        config = self._config
        return TTSServerStream(ws, max_queued=config.max_queued_messages, read_timeout_s=config.read_timeout_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


class TTSServerStream:
    """One reply's WebSocket: text goes out in order through a bounded queue, words and audio
    come back until the server closes after the speech."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, max_queued: int, read_timeout_s: float) -> None:
        self._ws = ws
        self._outgoing: asyncio.Queue[dict[str, str]] = asyncio.Queue(max_queued)
        self._sender = asyncio.create_task(self._send())
        self._read_timeout_s = read_timeout_s
        self.ended = False

    def send_text(self, text: str) -> None:
        if self.ended:
            raise EngineError("text after the end of stream", code=STREAM_ALREADY_ENDED)
        self._queue({"type": "Text", "text": text})

    def end(self) -> None:
        if self.ended:
            raise EngineError("end of stream sent twice", code=STREAM_ALREADY_ENDED)
        self._queue(_EOS)
        self.ended = True

    def _queue(self, message: dict[str, str]) -> None:
        try:
            self._outgoing.put_nowait(message)
        except asyncio.QueueFull:
            raise EngineError("the TTS server takes the text slower than it comes", code=INPUT_BACKPRESSURE) from None

    async def _send(self) -> None:
        with contextlib.suppress(ConnectionError):  # the reader sees the close and says why
            while True:
                message = await self._outgoing.get()
                await self._ws.send_bytes(_pack(message))
                if message is _EOS:
                    return

    async def events(self) -> AsyncIterator[SpeechEvent]:
        while not isinstance(message := await _receive(self._ws, self._read_timeout_s), _Closed):
            kind = message.get("type")
            if kind == "Error":
                raise _refusal(message)
            if kind in ("Audio", "Text"):
                yield _event(message)
        if not self.ended or message.code not in (aiohttp.WSCloseCode.OK, None):
            raise EngineError(
                f"the TTS server closed the stream before its end (close code {message.code}, "
                f"end of stream {'sent' if self.ended else 'not sent'})",
                code=ENGINE_UNAVAILABLE,
            )

    async def close(self) -> None:
        self._sender.cancel()
        await asyncio.gather(self._sender, return_exceptions=True)
        await self._ws.close()


@dataclass(frozen=True)
class _Closed:
    """The socket closed: ``code``, the server's close frame's (None: none came)."""

    code: int | None


async def _receive(ws: aiohttp.ClientWebSocketResponse, timeout_s: float) -> dict[str, Any] | _Closed:
    """The next MessagePack map, or how the socket closed."""
    try:
        message = await ws.receive(timeout=timeout_s)
    except TimeoutError:
        raise EngineError(f"the TTS server sent nothing for {timeout_s:g} s", code=ENGINE_UNAVAILABLE) from None
    if message.type is aiohttp.WSMsgType.CLOSE:
        # The code the server sent, not ``ws.close_code``: aiohttp replaces that with 1006 when its
        # reply to the close fails, as it does once a server that did not wait for it has gone (a
        # reader at playback pace reaches the close frame seconds after it was sent).
        return _Closed(message.data)
    if message.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
        return _Closed(ws.close_code)
    if message.type is aiohttp.WSMsgType.ERROR:
        raise EngineError("the connection to the TTS server broke", code=ENGINE_UNAVAILABLE)
    try:
        unpacked: Any = msgpack.unpackb(message.data, raw=False) if message.type is aiohttp.WSMsgType.BINARY else None
    except (ValueError, msgpack.UnpackException):
        unpacked = None
    if not isinstance(unpacked, dict):
        raise EngineError("the TTS server sent a message outside its protocol")
    return unpacked


def _event(message: dict[str, Any]) -> SpeechEvent:
    """An ``Audio`` or ``Text`` message as the stream's event."""
    try:
        if message["type"] == "Audio":
            return SpeechAudio(np.asarray(message["pcm"], dtype=np.float32).reshape(-1))
        return SpokenWord(str(message["text"]), float(message["start_s"]), float(message["stop_s"]))
    except (KeyError, TypeError, ValueError):
        raise EngineError(f"the TTS server sent a malformed {message['type']} message") from None


def _refusal(message: dict[str, Any]) -> EngineError:
    """The server's ``Error`` (or another message in place of ``Ready``) as the error a reply fails with."""
    text = str(message.get("message", "the TTS server refused the stream"))[:200]
    code = message.get("code")
    if code == RESOURCE_EXHAUSTED or text == "no free channels":  # moshi-server's words, without a code
        return CapacityExhausted(f"the TTS server is full: {text}")
    return EngineError(f"the TTS server: {text}", code=code if code in _KNOWN_CODES else None)


def _pack(message: dict[str, str]) -> bytes:
    packed = msgpack.packb(message, use_bin_type=True)
    assert isinstance(packed, bytes)
    return packed
