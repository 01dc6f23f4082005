"""What ``/api/chat`` and ``/v1/audio/duplex`` share: admission onto the engine, the
output path (engine hand-off -> socket), metrics, and the open sockets (shutdown). A
lockstep engine's slot is held directly (``EngineBridge``); a turn engine (the cascade)
runs in the session core with server VAD (``TurnBridge``, ``turns.py``).

Close codes (RFC 6455 §7.4.1) used by both routes:

* 1000 normal end, or a deadline passed: no client audio for ``moshi.idle_timeout_s``, no
  ``open`` within ``moshi.open_timeout_s`` (``deadlines.py``); 1001 server shutting down;
* 1007 malformed audio (an invalid Ogg-Opus stream);
* 1008 a refused prompt (unknown or unsafe voice name, bad seed), or audio decoded faster
  than ``codecs.max_decoded_audio_ratio`` allows;
* 1009 a message over ``transport.max_ws_message_bytes`` (aiohttp closes it);
* 1011 the engine failed this conversation (or an unexpected server error);
* 1013 every conversation slot is busy, or the engine is not running ("try again later").

A reader that takes no bytes for ``moshi.send_timeout_s`` loses its connection (no close
frame: it could not be sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import WSCloseCode, web

from rtserve.config import ServerConfig
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.protocols import SessionEngine
from rtserve.engines.values import SessionOptions, SlotPrompt
from rtserve.errors import RESOURCE_EXHAUSTED
from rtserve.log import session_id_var
from rtserve.sessions import SessionError, SessionManager
from rtserve.sessions.session_config import ConfigUpdateError
from rtserve.web.connections import SHUTDOWN_REASON, Connections, close_socket
from rtserve.web.error_mapping import close_code
from rtserve.web.moshi.bridge import AgentFrame, EngineBridge
from rtserve.web.moshi.deadlines import send_within
from rtserve.web.moshi.metrics import MoshiMetrics
from rtserve.web.moshi.turns import TurnBridge, turn_session_config
from rtserve.web.subprotocols import key_subprotocols

# What a route holds: frames from a lockstep engine, or turns through the session core.
ChatBridge = EngineBridge | TurnBridge

log = logging.getLogger(__name__)

BUSY_REASON = "all conversation slots busy"


class MoshiService:
    def __init__(
        self, config: ServerConfig, engine: SessionEngine, metrics: MoshiMetrics, sessions: SessionManager | None = None
    ) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics
        self.sessions = sessions  # turn engines: conversations run in the session core (``turns.py``)
        self.connections = Connections("Moshi-protocol", config.sessions.shutdown_timeout_s)

    # ------------------------------------------------------------------ sockets

    def websocket(self, request: web.Request) -> web.WebSocketResponse:
        transport = self.config.transport
        return web.WebSocketResponse(
            protocols=key_subprotocols(request),
            max_msg_size=transport.max_ws_message_bytes,
            heartbeat=transport.ws_heartbeat_s,
        )

    # ------------------------------------------------------------------ admission

    async def open_conversation(self, ws: web.WebSocketResponse, route: str, prompt: SlotPrompt) -> ChatBridge | None:
        """A conversation on a fresh engine slot, or ``None`` after closing ``ws`` with the
        reason (1013 when every slot is busy). Returns once the engine has the slot ready."""
        outcomes = self.metrics.connections_total
        if self.connections.closing:
            await close_socket(ws, WSCloseCode.GOING_AWAY, SHUTDOWN_REASON)
            return None
        if self.engine.capabilities.mode == "turn" and self.sessions is not None:
            return await self._open_turns(ws, route, prompt)
        session_id = f"moshi-{uuid.uuid4().hex[:16]}"
        session_id_var.set(session_id)
        try:
            session = await self.engine.open_session(session_id, SessionOptions(prompt=prompt, route=route))
        except CapacityExhausted as exc:
            outcomes.labels(route, "busy").inc()
            await close_socket(ws, close_code(exc), BUSY_REASON)
            return None
        except EngineError as exc:
            outcomes.labels(route, "engine_error").inc()
            log.warning("engine refused a conversation: %s (%s)", exc, exc.code)
            await close_socket(ws, close_code(exc), str(exc))
            return None
        except Exception:
            outcomes.labels(route, "engine_error").inc()
            log.exception("opening an engine session failed")
            await close_socket(ws, WSCloseCode.INTERNAL_ERROR, "internal error")
            return None
        conversation = EngineBridge(session, route=route, metrics=self.metrics)
        if ws.closed:  # the client left, or shutdown began, while the slot was being prepared
            await conversation.close()
            return None
        outcomes.labels(route, "accepted").inc()
        log.info(
            "%s conversation opened (voice=%s, persona=%s)", route, prompt.voice is not None, prompt.text is not None
        )
        return conversation

    async def _open_turns(self, ws: web.WebSocketResponse, route: str, prompt: SlotPrompt) -> TurnBridge | None:
        """A turn engine's conversation: a session-core session with server VAD (``turns.py``)."""
        assert self.sessions is not None
        outcomes = self.metrics.connections_total
        try:
            handle = await self.sessions.open(turn_session_config(prompt, self.sessions), resumable=False, route=route)
        except ConfigUpdateError as exc:
            outcomes.labels(route, "refused").inc()
            await close_socket(ws, WSCloseCode.POLICY_VIOLATION, exc.message)
            return None
        except SessionError as exc:
            outcomes.labels(route, "busy" if exc.code == RESOURCE_EXHAUSTED else "engine_error").inc()
            log.info("session refused a conversation: %s (%s)", exc, exc.code)
            await close_socket(ws, close_code(exc), BUSY_REASON if exc.code == RESOURCE_EXHAUSTED else str(exc))
            return None
        session_id_var.set(handle.session_id)
        conversation = TurnBridge(handle, route=route, metrics=self.metrics)
        if ws.closed:
            await conversation.close()
            return None
        outcomes.labels(route, "accepted").inc()
        log.info("%s conversation opened on the session core (server VAD, persona=%s)", route, prompt.text is not None)
        return conversation

    @contextlib.asynccontextmanager
    async def live(self, route: str, conversation: ChatBridge) -> AsyncIterator[None]:
        """Counts the conversation as open; releases its engine slot on the way out."""
        gauge = self.metrics.connections.labels(route)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()
            await conversation.close()
            log.info("%s conversation closed", route)

    # ------------------------------------------------------------------ output

    def spawn_output(
        self,
        ws: web.WebSocketResponse,
        transport: asyncio.Transport | None,
        route: str,
        conversation: ChatBridge,
        send_frame: Callable[[AgentFrame], Awaitable[None]],
    ) -> asyncio.Task[None]:
        """Stream the conversation's output to ``ws``; close it with 1011 if the engine fails, drop
        the connection if its reader stalls."""

        async def run() -> None:
            if not await self.stream_output(route, conversation, send_frame, transport):
                return
            if conversation.failure is not None:
                log.warning("engine failed the conversation: %s", conversation.failure.message)
                await close_socket(ws, WSCloseCode.INTERNAL_ERROR, conversation.failure.message)
            elif conversation.ended_by_server is not None:  # e.g. sessions.max_session_duration_s
                await close_socket(ws, WSCloseCode.OK, conversation.ended_by_server)

        return asyncio.create_task(run())

    @staticmethod
    async def stop_output(output: asyncio.Task[None]) -> None:
        output.cancel()
        await asyncio.gather(output, return_exceptions=True)

    async def stream_output(
        self,
        route: str,
        conversation: ChatBridge,
        send_frame: Callable[[AgentFrame], Awaitable[None]],
        transport: asyncio.Transport | None,
    ) -> bool:
        """Engine frames -> ``send_frame`` until the session ends or the socket closes; False
        when the reader stalled past ``moshi.send_timeout_s`` and the connection was dropped. A
        slow client only backs up its own slot's output hand-off (drop-oldest audio, text
        kept); the engine never waits for it."""
        send_timeout_s = self.config.moshi.send_timeout_s
        loop = asyncio.get_running_loop()
        frames_out = self.metrics.frames_out.labels(route)
        latency = self.metrics.egress_latency.labels(route)
        server_path = self.metrics.server_path.labels(route)
        path_wait = self.metrics.server_path_part.labels(route, "wait")
        path_back = self.metrics.server_path_part.labels(route, "back")
        try:
            async for frame in conversation.frames():
                if not await send_within(send_frame(frame), transport, send_timeout_s):
                    return False
                if frame.pcm.size:
                    frames_out.inc()
                    latency.observe(loop.time() - frame.produced_at)
                if frame.input_at is not None:
                    server_path.observe(loop.time() - frame.input_at)
                    if frame.tick_due is not None:
                        path_wait.observe(max(0.0, frame.tick_due - frame.input_at))
                        path_back.observe(max(0.0, frame.produced_at - frame.tick_due))
        except ConnectionError:
            pass  # the socket is closing; the receive side ends the connection
        return True
