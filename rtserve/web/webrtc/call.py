"""One WebRTC call: its peer connection, its session, and how it ends.

The session is admitted before the offer is answered (a full server answers 429, not an
SDP that leads nowhere) and served by ``RealtimeConnection``, the connection code of
``/v1/realtime``, over ``CallTransport``: the ``oai-events`` data channel and the media
track. Audio: ``InboundAudio`` reads the microphone track into the session,
``OutboundAudioTrack`` plays the agent. A camera track (``video_in``) feeds the session's
frames when the offer has one.

A call ends, once, with a reason the session's ``session.closed`` carries: ``hangup``
(``POST /v1/realtime/calls/{id}/hangup``), ``peer_closed`` (the peer closed the
connection or the data channel), ``ice_failed``, ``connect_timeout`` (not connected
within ``webrtc.connect_timeout_s`` of the answer), ``shutdown``; or the session ended
first (idle expiry, output backpressure, engine failure) and the call follows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from rtserve.config import WebRtcConfig
from rtserve.errors import INPUT_BACKPRESSURE
from rtserve.log import session_id_var
from rtserve.sessions import SessionHandle
from rtserve.sessions.events import ErrorEvent
from rtserve.web.realtime.connection import Dialect, RealtimeConnection
from rtserve.web.realtime.service import RealtimeService
from rtserve.web.video_input import VideoInput
from rtserve.web.webrtc.audio_in import InboundAudio
from rtserve.web.webrtc.audio_out import OutboundAudioTrack
from rtserve.web.webrtc.channel import DataChannelSocket, client_event_type
from rtserve.web.webrtc.events import CallTransport, buffer_event
from rtserve.web.webrtc.ice import rtc_configuration
from rtserve.web.webrtc.metrics import WebRtcMetrics
from rtserve.web.webrtc.offer import invalid_sdp
from rtserve.web.webrtc.video_in import InboundVideo

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 2.0  # for session.closed to leave on the data channel before the connection goes


class Call:
    def __init__(
        self,
        call_id: str,
        handle: SessionHandle,
        settings: WebRtcConfig,
        realtime: RealtimeService,
        dialect: Dialect,
        metrics: WebRtcMetrics,
        *,
        expects_channel: bool,
        video: VideoInput | None,
        on_done: Callable[[Call], None],
    ) -> None:
        self.call_id = call_id
        self.handle = handle
        self._settings = settings
        self._engine_rate = realtime.engine_capabilities.input_sample_rate
        self._metrics = metrics
        self._on_done = on_done
        self.pc = RTCPeerConnection(rtc_configuration(settings))
        self.socket = DataChannelSocket(
            expects_channel=expects_channel,
            max_pending=settings.max_pending_events,
            max_buffered_bytes=settings.data_channel_buffer_bytes,
            on_overflow=self._events_overflow,
            on_client_event=self._webrtc_event,
        )
        self.track = OutboundAudioTrack(
            settings.outbound_queue_ms,
            on_started=self._audio_started,
            on_stopped=self._audio_stopped,
            late_frames=metrics.late_frames,
        )
        self.connection = RealtimeConnection(CallTransport(self.socket, self.track), realtime, dialect, handle.config)
        self.inbound: InboundAudio | None = None
        self._video = video  # None: the offer has no camera
        self.inbound_video: InboundVideo | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving: asyncio.Task[None] | None = None
        self._ending: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.reason: str | None = None

    # ---------------------------------------------------------------- setup

    async def answer(self, offer_sdp: str) -> str:
        """Apply the offer and return the answer SDP (every candidate gathered: no trickle)."""
        self.pc.on("datachannel", lambda channel: self.socket.bind(channel, lambda: self.end_soon("peer_closed")))
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except ValueError:  # aiortc's SDP checks; its text names internals, so it stays out of the answer
            raise invalid_sdp(
                "The SDP offer was refused: its media sections do not describe a call this server can answer."
            ) from None
        if not any(t.kind == "audio" for t in self.pc.getTransceivers()):
            raise invalid_sdp("The SDP offer has no audio section (m=audio).")
        self.pc.addTrack(self.track)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription.sdp

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._serving = loop.create_task(self.connection.run(self.handle), name=f"webrtc-call:{self.call_id}")
        self._serving.add_done_callback(lambda _: self.end_soon("session_closed"))
        self._timer = loop.call_later(self._settings.connect_timeout_s, self._connect_deadline)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video" and self._video is not None and self.inbound_video is None:
            self.inbound_video = InboundVideo(track, self._video)
            self._spawn(self.inbound_video.run())
            return
        if track.kind != "audio" or self.inbound is not None:
            return
        self.inbound = InboundAudio(
            track,
            self.handle,
            self._engine_rate,
            self._settings.inbound_backlog_frames,
            self._metrics.inbound_dropped_frames,
        )
        self._spawn(self.inbound.run())

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            if self._timer is not None:
                self._timer.cancel()
            log.info("call %s connected", self.call_id)
        elif state == "failed":
            self.end_soon("ice_failed")
        elif state == "closed":
            self.end_soon("peer_closed")

    def _connect_deadline(self) -> None:
        if self.pc.connectionState != "connected":
            self.end_soon("connect_timeout")

    # ---------------------------------------------------------------- events of the call itself

    def _webrtc_event(self, text: str) -> bool:
        if client_event_type(text) != "output_audio_buffer.clear":
            return False
        self._spawn(self.connection.interrupt_playback())
        return True

    def _events_overflow(self) -> None:
        self._metrics.dropped_events.inc()
        self.handle.report(
            ErrorEvent(
                session_id=self.handle.session_id,
                code=INPUT_BACKPRESSURE,
                message="Too many events are waiting on the data channel; this one was dropped",
            )
        )

    def _audio_started(self, response_id: str) -> None:
        self.socket.send_now(buffer_event("started", response_id))

    def _audio_stopped(self, response_id: str) -> None:
        self.socket.send_now(buffer_event("stopped", response_id))

    # ---------------------------------------------------------------- ending

    def end_soon(self, reason: str) -> None:
        if self._ending is None:
            self._ending = asyncio.get_running_loop().create_task(self._end(reason))

    async def end(self, reason: str) -> None:
        self.end_soon(reason)
        assert self._ending is not None
        await asyncio.shield(self._ending)

    async def _end(self, reason: str) -> None:
        session_id_var.set(self.handle.session_id)
        self.reason = reason
        if self._timer is not None:
            self._timer.cancel()
        # session.closed is queued first; the sender forwards it, then closes the channel.
        await self.handle.close(reason)
        if self._serving is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._serving), CLOSE_GRACE_S)
            except TimeoutError:
                await self.socket.close()
                await asyncio.gather(self._serving, return_exceptions=True)
        await self.socket.close()
        self.track.stop()
        await self.pc.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._metrics.ended.labels(reason).inc()
        log.info("call %s ended (%s)", self.call_id, reason)
        self._on_done(self)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
