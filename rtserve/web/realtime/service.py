"""``WS /v1/realtime`` (OpenAI Realtime, turn-based or ``?duplex=1``) and ``WS /v1/duplex``
(native duplex dialect) over the app's ``SessionManager``.

Connections are served by ``RealtimeConnection``; what each one speaks is decided by
``dialect``; client frames are parsed by ``client_events``. Limits: frames over
``transport.max_ws_message_bytes`` close the socket with 1009; WebSocket pings every
``transport.ws_heartbeat_s`` (a peer that misses its pong is dropped); admission and idle
expiry come from ``sessions`` (``resource_exhausted`` error then close 1013 at capacity).
The URL's ``session_id``/``resume`` are read by ``connect_query``; a bad one is an
``error`` event then close 1008.
With ``transport.duplex_sessions`` off, ``/v1/duplex`` answers an ``error`` event
"Duplex API is not available" (code ``duplex_unavailable``) and closes with 1008.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from typing import TypedDict

from aiohttp import WSCloseCode, web
from prometheus_client import CollectorRegistry, Counter, Gauge

from rtserve.config import ServerConfig
from rtserve.engines.protocols import ASREngine
from rtserve.engines.values import EngineCapabilities
from rtserve.errors import DUPLEX_API_UNAVAILABLE, NATIVE_DUPLEX_UNAVAILABLE
from rtserve.sessions import SessionConfig, SessionManager, TurnDetection
from rtserve.sessions.events import ErrorEvent
from rtserve.sessions.projections import NativeDuplexProjection
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.connections import Connections, close_socket
from rtserve.web.peers import Origin, Peers
from rtserve.web.realtime.connect_query import connect_query
from rtserve.web.realtime.connection import RealtimeConnection
from rtserve.web.realtime.dialect import DUPLEX_ROUTE, accepted_subprotocols, native_duplex_mismatch, select_dialect
from rtserve.web.realtime.errors import WireError
from rtserve.web.realtime.transport import WebSocketTransport

DUPLEX_UNAVAILABLE = "Duplex API is not available"
_MAX_MODEL_CHARS = 256


class _SendBufferLimit(TypedDict, total=False):
    writer_limit: int  # absent: aiohttp's own default


class RealtimeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Gauge(
            "rtserve_realtime_connections", "Open realtime WebSocket connections", ["route"], registry=registry
        )
        self.client_errors = Counter(
            "rtserve_realtime_client_errors", "Error events answering client frames", ["code"], registry=registry
        )


class RealtimeService:
    """App-wide state of the realtime routes: the session manager, limits, codec executor, open sockets."""

    def __init__(
        self,
        config: ServerConfig,
        sessions: SessionManager,
        capabilities: EngineCapabilities,
        codecs: CodecExecutor,
        registry: CollectorRegistry,
    ) -> None:
        self.config = config
        self.codecs = codecs
        self.limits = config.sessions
        self.sessions = sessions
        self.engine_capabilities = capabilities
        self.metrics = RealtimeMetrics(registry)
        self.connections = Connections("realtime", config.sessions.shutdown_timeout_s)
        # The recognizer for ``input_audio`` items (``audio_items.py``); set by ``routes.setup``.
        self.asr: Callable[[], ASREngine | None] = lambda: None
        self.peers: Peers | None = None  # the other front-ends (``web/peers``); set by its ``setup``

    def websocket(self, request: web.Request) -> web.WebSocketResponse:
        # No permessage-deflate: base64 audio barely compresses and deflate costs CPU per frame.
        transport = self.config.transport
        extra: _SendBufferLimit = (
            {} if transport.ws_send_buffer_bytes is None else {"writer_limit": transport.ws_send_buffer_bytes}
        )
        return web.WebSocketResponse(
            protocols=accepted_subprotocols(request),
            heartbeat=transport.ws_heartbeat_s,
            max_msg_size=transport.max_ws_message_bytes,
            compress=False,
            **extra,
        )

    def bound_send_buffers(self, request: web.Request) -> None:
        limit = self.config.transport.ws_send_buffer_bytes
        transport = request.transport
        if limit is None or transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit)
        transport.set_write_buffer_limits(high=limit)

    def initial_config(self, request: web.Request) -> SessionConfig:
        """What a session opened on this connection starts from: OpenAI's defaults (server VAD
        on when the engine has one) and the ``model`` named in the URL."""
        model = request.query.get("model", "")[:_MAX_MODEL_CHARS] or None
        vad = TurnDetection() if self.engine_capabilities.supports_server_vad else None
        return SessionConfig(model=model, turn_detection=vad)

    async def handle(self, request: web.Request, route: str) -> web.WebSocketResponse:
        ws = self.websocket(request)
        await ws.prepare(request)
        self.bound_send_buffers(request)
        if route == DUPLEX_ROUTE and not self.config.transport.duplex_sessions:
            await self._refuse_duplex(ws)
            return ws
        mismatch = native_duplex_mismatch(request, self.engine_capabilities)
        if mismatch is not None:
            await self._refuse(ws, NATIVE_DUPLEX_UNAVAILABLE, mismatch)
            return ws
        origin = Origin.of(request)
        peers = self.peers
        owner = peers.remote_owner(request.query.get("session_id")) if peers is not None else None
        gauge = self.metrics.connections.labels(route)
        if peers is not None and owner is not None:  # another front-end's session: the whole socket goes there
            gauge.inc()
            try:
                async with self.connections.track(ws):
                    if await peers.relay_socket(ws, owner, origin):
                        return ws
            finally:
                gauge.dec()
        dialect = select_dialect(request, route, self.engine_capabilities, self.config.transport.duplex_sessions)
        try:
            query = connect_query(request, duplex=dialect.duplex, limits=self.limits)
        except WireError as exc:
            await self._refuse(ws, exc.code, exc.message, param=exc.param)
            return ws
        relay = None if self.peers is None else functools.partial(self.peers.relay_resume, ws, origin=origin)
        connection = RealtimeConnection(
            WebSocketTransport(ws, request.transport), self, dialect, self.initial_config(request), query, relay=relay
        )
        gauge.inc()
        try:
            # A socket with a session ends after the session's last event (the manager's shutdown).
            async with self.connections.track(ws, close_at_shutdown=lambda: connection.handle is None):
                await connection.run()
        finally:
            gauge.dec()
        return ws

    async def _refuse(self, ws: web.WebSocketResponse, code: str, message: str, *, param: str | None = None) -> None:
        """An ``error`` event, then close 1008: the connection asked for what this server is not."""
        self.metrics.client_errors.labels(code).inc()
        error = ErrorEvent(session_id="", code=code, message=message, param=param)
        try:
            await ws.send_str(NativeDuplexProjection().render_text(error))
        except ConnectionError:
            return
        await close_socket(ws, WSCloseCode.POLICY_VIOLATION, message)

    async def _refuse_duplex(self, ws: web.WebSocketResponse) -> None:
        await self._refuse(ws, DUPLEX_API_UNAVAILABLE, DUPLEX_UNAVAILABLE)
