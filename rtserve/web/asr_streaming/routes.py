"""``WS /api/asr-streaming``: moshi-server's streaming speech-to-text protocol, so Kyutai's clients
and Unmute work unchanged (docs/serving.md#asr-streaming).

One connection is one stream on the app's speech-to-text engine: the Kyutai STT engine
(``stt_engine``) when configured, else the app's ASR engine (the cascade's Whisper) behind
the VAD (``engines/cascade/speech_stream``):
``Ready`` once the stream holds a slot, then per model step a ``Step``, the ``Word`` /
``EndWord`` messages as words complete, and each ``Marker`` once everything sent before it
is transcribed. Three tasks share the connection: this handler reads the client, a pump
turns the stream's events into bytes on a bounded queue, a writer sends them.

Bad input ends the connection with a typed ``Error`` then a close, never touching another
stream: a message that is not msgpack or of the wrong shape, non-finite samples, more than
``max_pending_markers`` markers waiting,
no valid message for ``idle_timeout_s``, and a reader that stalls (its queue over
``max_queued_events``, or a send stuck ``send_timeout_s``). A message over
``max_message_bytes`` is refused by aiohttp from its header, with close 1009 and no ``Error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass

from aiohttp import WSCloseCode, WSMsgType, web

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_stt.service import SpeechStream, SpeechStreamEngine
from rtserve.errors import (
    ASR_STREAMING_UNAVAILABLE,
    OUTPUT_BACKPRESSURE,
    SESSION_IDLE_TIMEOUT,
    TOO_MANY_MARKERS,
    RtserveError,
)
from rtserve.log import session_id_var
from rtserve.web.asr_streaming.wire import READY, AsrWireError, AudioIn, MarkerIn, pack_error, pack_event, parse
from rtserve.web.connections import Connections, close_socket
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.route_engine import run_with_app
from rtserve.web.subprotocols import key_subprotocols

log = logging.getLogger(__name__)

ROUTE = "/api/asr-streaming"
_ids = itertools.count(1)


@dataclass
class AsrStreamingService:
    engine: SpeechStreamEngine | None
    connections: Connections


ASR_STREAMING = web.AppKey("asr_streaming", AsrStreamingService)


class _Outbox:
    """The bounded queue between the stream's events and the socket writer."""

    def __init__(self, limit: int) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(limit)

    def put(self, data: bytes) -> None:
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            raise RtserveError("the client is not reading its messages", code=OUTPUT_BACKPRESSURE) from None


async def asr_socket(request: web.Request) -> web.WebSocketResponse:
    ctx = request.app[CTX]
    service = request.app[ASR_STREAMING]
    limits = ctx.config.asr_streaming
    engine = service.engine
    if engine is None:  # before the handshake, as /api/tts_streaming: the client learns why
        raise ApiError(
            "this server has no speech-to-text engine (neither stt_engine.weights nor an engine with an ASR)",
            status=404,
            code=ASR_STREAMING_UNAVAILABLE,
        )
    ws = web.WebSocketResponse(
        protocols=key_subprotocols(request),
        max_msg_size=limits.max_message_bytes,
        heartbeat=ctx.config.transport.ws_heartbeat_s,
        compress=False,
    )
    await ws.prepare(request)
    stream_id = f"asr-{next(_ids)}"
    token = session_id_var.set(stream_id)
    try:
        async with service.connections.track(ws):
            await _serve(ws, engine, stream_id, request)
    finally:
        session_id_var.reset(token)
    return ws


async def _serve(ws: web.WebSocketResponse, engine: SpeechStreamEngine, stream_id: str, request: web.Request) -> None:
    limits = request.app[CTX].config.asr_streaming
    try:
        stream = await engine.open_stream(stream_id)
    except EngineError as exc:
        await _fail(ws, exc, WSCloseCode.TRY_AGAIN_LATER)
        return
    outbox = _Outbox(limits.max_queued_events)
    outbox.put(READY)
    writer = asyncio.create_task(_write(ws, outbox, limits.send_timeout_s), name=f"{stream_id}-writer")
    pump = asyncio.create_task(_pump(stream, outbox), name=f"{stream_id}-pump")
    reader = asyncio.create_task(_read(ws, stream, limits.idle_timeout_s, limits.max_pending_markers))
    try:
        done, _ = await asyncio.wait({writer, pump, reader}, return_when=asyncio.FIRST_COMPLETED)
        failure = next((t.exception() for t in done if t.exception() is not None), None)
    finally:
        for task in (writer, pump, reader):
            task.cancel()
        await asyncio.gather(writer, pump, reader, return_exceptions=True)
        await stream.close(engine.release_timeout_s)
    if isinstance(failure, RtserveError):
        log.info("asr stream ended: %s (%s)", failure.message, failure.code)
        await _fail(ws, failure, WSCloseCode.POLICY_VIOLATION)
    elif failure is not None:
        raise failure
    else:
        await close_socket(ws, WSCloseCode.OK, "done")


async def _fail(ws: web.WebSocketResponse, error: RtserveError, close_code: int) -> None:
    """The typed ``Error``, then the close (a socket already gone is not an error)."""
    with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
        await asyncio.wait_for(ws.send_bytes(pack_error(error)), 1.0)
    await close_socket(ws, close_code, error.code)


async def _read(ws: web.WebSocketResponse, stream: SpeechStream, idle_timeout_s: float, max_markers: int) -> None:
    """Until the client closes; a rule broken raises the typed error."""
    while True:
        try:
            message = await ws.receive(timeout=idle_timeout_s)
        except TimeoutError:
            raise RtserveError(f"no message for {idle_timeout_s:g} s", code=SESSION_IDLE_TIMEOUT) from None
        if message.type == WSMsgType.BINARY:
            parsed = parse(message.data)
            if isinstance(parsed, AudioIn):
                stream.push_audio(parsed.pcm)
            elif isinstance(parsed, MarkerIn):
                if stream.pending_markers >= max_markers:
                    raise AsrWireError(f"more than {max_markers} markers waiting", code=TOO_MANY_MARKERS)
                stream.mark(parsed.id)
        elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return  # an oversized message is an ERROR: aiohttp has already closed with 1009
        # Text frames and pings are ignored, as moshi-server does.


async def _pump(stream: SpeechStream, outbox: _Outbox) -> None:
    async for event in stream.events():
        outbox.put(pack_event(event))
    await asyncio.Event().wait()  # the stream ended (the engine stopped): the reader decides when to close


async def _write(ws: web.WebSocketResponse, outbox: _Outbox, send_timeout_s: float) -> None:
    while True:
        data = await outbox.queue.get()
        try:
            # Not wait_for: on Python 3.11 it returns the send's result when a cancel arrives as the
            # send completes, and this loop then waited on the queue for good, holding the stream.
            async with asyncio.timeout(send_timeout_s):
                await ws.send_bytes(data)
        except TimeoutError:
            raise RtserveError(f"the client took no bytes for {send_timeout_s:g} s", code=OUTPUT_BACKPRESSURE) from None


async def _on_shutdown(app: web.Application) -> None:
    await app[ASR_STREAMING].connections.close_all()


def setup(app: web.Application, engine: SpeechStreamEngine | None, *, owned: bool = True) -> None:
    """``engine``: the speech-to-text engine this app serves, or None; ``owned``: started and
    stopped with the app (not when the session engine lends its own: it runs it)."""
    ctx = app[CTX]
    connections = Connections("asr-streaming", ctx.config.sessions.shutdown_timeout_s)
    app[ASR_STREAMING] = AsrStreamingService(engine, connections)
    app.router.add_get(ROUTE, asr_socket)
    app.on_shutdown.append(_on_shutdown)
    if engine is not None and owned:
        run_with_app(app, engine, "asr-streaming")
