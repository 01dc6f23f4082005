"""Registers ``WS /api/tts_streaming`` (docs/serving.md#tts-streaming).

The route exists on every server. Where ``tts_engine.weights`` is set the Kyutai TTS engine
speaks it (the engines' one copy, here or in the engine process over the engine link; it loads
at startup, the server answering meanwhile); elsewhere the app's turn-engine TTS (Piper) does, sentence by sentence
(``engines/cascade/tts_stream.py``). A server with neither answers an upgrade before the
handshake with HTTP 404 and code ``tts_streaming_unavailable``, so a client learns why instead
of meeting a bare 404. Query: ``voice`` (Kyutai: a name in ``tts_engine.voices``, none:
``tts_engine.default_voice``; Piper: one of its voices, none: its default), ``format``
(``PcmMessagePack``, the default, or ``OggOpus``), ``seed`` (an integer: reproducible sampling;
Kyutai only). The ``kyutai-api-key`` header carries the API key as moshi-server's clients send
it (``web/auth.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from aiohttp import web

from rtserve.engines.cascade.tts_stream import PiperSpeechStreams
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.kyutai_tts.service import SpeechStreams, TTSStreamEngine
from rtserve.errors import INVALID_VALUE, TTS_STREAMING_UNAVAILABLE
from rtserve.log import session_id_var
from rtserve.web.connections import Connections, close_socket
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.route_engine import run_with_app
from rtserve.web.subprotocols import key_subprotocols
from rtserve.web.tts_streaming import wire
from rtserve.web.tts_streaming.connection import TTSConnection
from rtserve.web.tts_streaming.wire import OutputFormat

ROUTE = "/api/tts_streaming"
NO_FREE_CHANNELS = "no free channels"  # moshi-server's words when every slot is busy
# aiohttp itself closes (1009, no Error message) past this many times max_message_bytes.
_HARD_SIZE_FACTOR = 4


@dataclass(frozen=True)
class TTSStreamingService:
    engine: TTSStreamEngine | None
    connections: Connections


TTS_STREAMING = web.AppKey("tts_streaming", TTSStreamingService)


def _query(request: web.Request) -> tuple[OutputFormat, int | None]:
    try:
        output = OutputFormat(request.query.get("format", OutputFormat.PCM_MESSAGE_PACK.value))
    except ValueError:
        raise ApiError("format must be PcmMessagePack or OggOpus", code=INVALID_VALUE, param="format") from None
    seed = request.query.get("seed")
    if seed is not None and not seed.isdigit():
        raise ApiError("seed must be a non-negative integer", code=INVALID_VALUE, param="seed")
    return output, None if seed is None else int(seed)


async def tts_socket(request: web.Request) -> web.StreamResponse:
    service = request.app[TTS_STREAMING]
    ctx = request.app[CTX]
    limits = ctx.config.tts_streaming
    engine: SpeechStreams
    if service.engine is not None:
        engine = service.engine
    elif (tts := ctx.turn_engines.tts) is not None:
        engine = PiperSpeechStreams(tts, max_pending_words=limits.max_pending_words)
    else:
        raise ApiError(
            "this server has no text-to-speech engine (neither tts_engine.weights nor a turn-engine TTS)",
            status=404,
            code=TTS_STREAMING_UNAVAILABLE,
        )
    output, seed = _query(request)
    ws = web.WebSocketResponse(
        protocols=key_subprotocols(request),
        max_msg_size=limits.max_message_bytes * _HARD_SIZE_FACTOR,
        # No pings: a client that reads the audio as it plays answers a ping only after the audio
        # queued before it, seconds late; a silent client is ended by idle_timeout_s, one that
        # stops reading by send_timeout_s.
        heartbeat=None,
        compress=False,
    )
    await ws.prepare(request)
    stream_id = f"tts_{uuid.uuid4().hex[:16]}"
    session_id_var.set(stream_id)
    async with service.connections.track(ws):
        try:
            stream = await engine.open_stream(stream_id, request.query.get("voice"), seed=seed)
        except CapacityExhausted as exc:
            await _refuse(ws, output, EngineError(NO_FREE_CHANNELS, code=exc.code))
            return ws
        except EngineError as exc:
            await _refuse(ws, output, exc)
            return ws
        connection = TTSConnection(
            ws,
            stream,
            output,
            max_message_bytes=limits.max_message_bytes,
            idle_timeout_s=limits.idle_timeout_s,
            send_timeout_s=limits.send_timeout_s,
            max_queued_messages=limits.max_queued_messages,
            max_audio_ahead_s=limits.max_audio_ahead_s,
            sample_rate=engine.sample_rate,
        )
        await connection.run()
    return ws


async def _refuse(ws: web.WebSocketResponse, output: OutputFormat, exc: EngineError) -> None:
    if output is OutputFormat.PCM_MESSAGE_PACK:
        await ws.send_bytes(wire.error(exc))
    await close_socket(ws, wire.close_code_for(exc), exc.message)


async def _on_shutdown(app: web.Application) -> None:
    await app[TTS_STREAMING].connections.close_all()


def setup(app: web.Application, engine: TTSStreamEngine | None, *, owned: bool = True) -> None:
    """``engine``: the Kyutai TTS engine this app serves (started and stopped with it when
    ``owned``; else the engine set's, which runs it), or None (the app's turn-engine TTS
    speaks, where it has one)."""
    config = app[CTX].config
    app[TTS_STREAMING] = TTSStreamingService(engine, Connections("tts_streaming", config.sessions.shutdown_timeout_s))
    app.router.add_get(ROUTE, tts_socket)
    app.on_shutdown.append(_on_shutdown)
    if engine is not None and owned:
        run_with_app(app, engine, "tts-streaming")
