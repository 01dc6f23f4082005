"""``WS /v1/video/chat/stream``: live video understanding (docs/video.md#video-chat-stream).

One connection is one session on the app's engine, named by the client's ``x-session-id``
header (or ``?session_id=``), as the realtime clients of the seed system name theirs. Frames
(JPEG/PNG, binary or base64 in JSON) go through ``VideoInput``: sampled, downscaled, held for
the next question; a ``text`` message is that question, answered with text deltas, speech
and ``response.done``. Refused before the handshake: an engine whose LLM cannot see
(``vision_unsupported``, 400) and a malformed session id (400).

Bad input is a typed ``error`` message and the connection goes on: a frame that is not a
JPEG/PNG (``invalid_image``) or over ``video_input.max_image_bytes`` / ``max_image_pixels``
(``image_too_large``), a message of the wrong shape. Frames faster than
``video_input.max_frames_per_s`` over a second end the connection (``frame_rate_exceeded``,
close 1008); a message over twice ``max_image_bytes`` is closed by aiohttp (1009).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from aiohttp import WSCloseCode, WSMsgType, web

from rtserve.codecs.images import ImageError, check_image, image_data_url
from rtserve.errors import FRAME_RATE_EXCEEDED, VISION_UNSUPPORTED, RtserveError
from rtserve.log import session_id_var
from rtserve.sessions import SessionConfig, SessionError, SessionHandle
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.web.connections import Connections, close_socket
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.realtime.connect_query import checked_session_id
from rtserve.web.realtime.errors import WireError
from rtserve.web.video_chat import wire
from rtserve.web.video_input import VideoInput

log = logging.getLogger(__name__)

ROUTE = "/v1/video/chat/stream"
SESSION_HEADER = "x-session-id"


@dataclass
class VideoChatService:
    connections: Connections


VIDEO_CHAT = web.AppKey("video_chat", VideoChatService)


class FrameRate:
    """A token bucket: ``per_s`` frames a second, a burst of one second's worth."""

    def __init__(self, per_s: float) -> None:
        self._per_s = per_s
        self._tokens = per_s
        self._at = time.monotonic()

    def take(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._per_s, self._tokens + (now - self._at) * self._per_s)
        self._at = now
        if self._tokens < 1:
            raise RtserveError(f"more than {self._per_s:g} frames a second", code=FRAME_RATE_EXCEEDED)
        self._tokens -= 1


async def video_chat_socket(request: web.Request) -> web.WebSocketResponse:
    ctx = request.app[CTX]
    limits = ctx.config.video_input
    if not ctx.engine.capabilities.supports_vision:
        raise ApiError(
            "This server's language model cannot see: live video needs a vision-language model (docs/video.md)",
            code=VISION_UNSUPPORTED,
        )
    requested = request.headers.get(SESSION_HEADER) or request.query.get("session_id")
    if not ctx.config.sessions.client_session_ids:  # as on /v1/realtime: the server names every session
        requested = None
    try:
        session_id = None if requested is None else checked_session_id(requested, ctx.config.sessions, SESSION_HEADER)
    except WireError as exc:
        raise ApiError(exc.message, code=exc.code, param=exc.param) from None
    ws = web.WebSocketResponse(
        max_msg_size=2 * limits.max_image_bytes,  # beyond the frame bound: refused typed up to twice it
        heartbeat=ctx.config.transport.ws_heartbeat_s,
        compress=False,
    )
    await ws.prepare(request)
    try:
        handle = await ctx.sessions.open(SessionConfig(), resumable=False, session_id=session_id)
    except SessionError as exc:
        await _fail(ws, exc, WSCloseCode.TRY_AGAIN_LATER)
        return ws
    token = session_id_var.set(handle.session_id)
    try:
        async with request.app[VIDEO_CHAT].connections.track(ws):
            await _serve(ws, handle, VideoInput(handle, ctx.codecs, limits))
    finally:
        session_id_var.reset(token)
        await handle.close()
    return ws


async def _serve(ws: web.WebSocketResponse, handle: SessionHandle, frames: VideoInput) -> None:
    await ws.send_str(wire.session_created(handle.session_id))
    pump = asyncio.create_task(_pump(ws, handle), name=f"video-chat-pump:{handle.session_id}")
    reader = asyncio.create_task(_read(ws, handle, frames))
    try:
        done, _ = await asyncio.wait({pump, reader}, return_when=asyncio.FIRST_COMPLETED)
        failure = next((t.exception() for t in done if t.exception() is not None), None)
    finally:
        for task in (pump, reader):
            task.cancel()
        await asyncio.gather(pump, reader, return_exceptions=True)
    if isinstance(failure, RtserveError):
        log.info("video chat ended: %s (%s)", failure.message, failure.code)
        await _fail(ws, failure, WSCloseCode.POLICY_VIOLATION)
    elif failure is not None:
        raise failure
    else:
        await close_socket(ws, WSCloseCode.OK, "done")


async def _read(ws: web.WebSocketResponse, handle: SessionHandle, frames: VideoInput) -> None:
    """Until the client closes; a flood raises the typed error, other bad input is answered and read on."""
    rate = FrameRate(frames.limits.max_frames_per_s)
    max_text = frames.limits.max_text_chars
    while True:
        message = await ws.receive()
        if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return
        try:
            if message.type == WSMsgType.BINARY:
                parsed: wire.FrameIn | wire.QuestionIn | wire.CloseIn = wire.FrameIn(message.data)
            elif message.type == WSMsgType.TEXT:
                parsed = wire.parse_text(message.data, max_text)
            else:
                continue
            if isinstance(parsed, wire.CloseIn):
                return
            if isinstance(parsed, wire.QuestionIn):
                handle.submit(cmd.ConversationItemCreate(role="user", text=parsed.text))
                handle.submit(cmd.ResponseCreate(max_output_tokens=parsed.max_output_tokens))
                continue
            rate.take()
            check_image(parsed.image, frames.limits)  # every frame, kept or not: its header only
            if frames.due():
                await frames.keep(image_data_url, parsed.image)
        except (ImageError, wire.VideoChatWireError) as exc:
            await ws.send_str(wire.error(exc))


async def _pump(ws: web.WebSocketResponse, handle: SessionHandle) -> None:
    """The session's events as messages, until it ends."""
    assert handle.attachment is not None
    async for event in handle.attachment:
        if isinstance(event, ev.SessionClosed | ev.SessionExpired):
            return
        if (text := wire.event_message(event)) is not None:
            await ws.send_str(text)


async def _fail(ws: web.WebSocketResponse, error: RtserveError, close_code: int) -> None:
    """The typed ``error``, then the close (a socket already gone is not an error)."""
    with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
        await asyncio.wait_for(ws.send_str(wire.error(error)), 1.0)
    await close_socket(ws, close_code, error.code)


async def _on_shutdown(app: web.Application) -> None:
    await app[VIDEO_CHAT].connections.close_all()


def setup(app: web.Application) -> None:
    ctx = app[CTX]
    app[VIDEO_CHAT] = VideoChatService(Connections("video-chat", ctx.config.sessions.shutdown_timeout_s))
    app.router.add_get(ROUTE, video_chat_socket)
    app.on_shutdown.append(_on_shutdown)
