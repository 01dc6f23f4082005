"""The WebRTC calls of one front-end process: placing, finding, hanging up, shutdown.

A call lives in the process that answered its offer; ``hangup`` must reach that process
(with ``--workers N``, the ``X-Rtserve-Worker`` header of the answer names it), as a
session resume must.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from rtserve import errors
from rtserve.config import ServerConfig
from rtserve.sessions import SessionError
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.realtime.client_events import EventRules
from rtserve.web.realtime.connection import Dialect
from rtserve.web.realtime.service import RealtimeService
from rtserve.web.video_input import VideoInput
from rtserve.web.webrtc.call import Call
from rtserve.web.webrtc.client_secrets import CALLS_ROUTE
from rtserve.web.webrtc.metrics import WebRtcMetrics
from rtserve.web.webrtc.offer import CallOffer
from rtserve.web.webrtc.projection import WebRtcProjection
from rtserve.web.webrtc.session_config import call_config

log = logging.getLogger(__name__)


def new_call_id() -> str:
    return f"rtc_{secrets.token_hex(12)}"


class WebRtcService:
    def __init__(self, config: ServerConfig, realtime: RealtimeService, metrics: WebRtcMetrics) -> None:
        self._config = config
        self._settings = config.webrtc
        self._realtime = realtime
        self._metrics = metrics
        self.calls: dict[str, Call] = {}
        self._placing = 0  # offers admitted against max_calls and not yet live or refused
        self._closing = False

    async def place(self, offer: CallOffer, bound_session: dict[str, Any] | None) -> Call:
        """Admit a session, answer the offer, start the call (its answer is ``call.pc.localDescription``)."""
        if self._closing:
            raise ApiError(
                "The server is shutting down.", status=503, code=errors.SHUTTING_DOWN, type_=errors.SERVER_ERROR
            )
        # The cap counts offers still being answered: it is reserved here, before the first
        # await, so concurrent offers cannot all pass the check and be counted only later.
        if len(self.calls) + self._placing >= self._settings.max_calls:
            raise ApiError(
                f"This server holds at most {self._settings.max_calls} calls; try again later.",
                status=429,
                code=errors.RESOURCE_EXHAUSTED,
            )
        self._placing += 1
        try:
            call = await self._answer(offer, bound_session)
        finally:
            self._placing -= 1
        self.calls[call.call_id] = call
        self._metrics.calls.set(len(self.calls))
        call.start()
        log.info("call %s placed (session %s)", call.call_id, call.handle.session_id)
        return call

    async def _answer(self, offer: CallOffer, bound_session: dict[str, Any] | None) -> Call:
        """A session admitted and the offer answered; nothing of the call is left on failure."""
        capabilities = self._realtime.engine_capabilities
        camera = "m=video" in offer.sdp
        if camera and not capabilities.supports_vision:  # refused before a session exists (docs/video.md)
            raise ApiError(
                "The SDP offer has a video section, and this server's language model cannot see; offer audio only.",
                code=errors.VISION_UNSUPPORTED,
                param="sdp",
            )
        config = call_config([bound_session, offer.session], capabilities, self._config.sessions)
        try:
            handle = await self._realtime.sessions.open(
                config, projection=WebRtcProjection(), resumable=False, route=CALLS_ROUTE
            )
        except SessionError as exc:
            raise api_error(exc) from None
        dialect = Dialect(
            CALLS_ROUTE,
            WebRtcProjection(),
            EventRules(duplex=False, supports_server_vad=capabilities.supports_server_vad),
            autostart=False,
            conversation_created=True,
        )
        call = Call(
            new_call_id(),
            handle,
            self._settings,
            self._realtime,
            dialect,
            self._metrics,
            expects_channel="m=application" in offer.sdp,
            video=VideoInput(handle, self._realtime.codecs, self._config.video_input) if camera else None,
            on_done=self._forget,
        )
        try:
            await call.answer(offer.sdp)
        except BaseException as exc:
            await asyncio.shield(call.end(errors.INVALID_SDP if isinstance(exc, ApiError) else errors.INTERNAL_ERROR))
            raise
        return call

    def get(self, call_id: str) -> Call:
        call = self.calls.get(call_id)
        if call is None:
            raise ApiError(
                f"No call '{call_id}' is live in this server process.",
                status=404,
                code=errors.UNKNOWN_CALL,
                param="call_id",
            )
        return call

    def _forget(self, call: Call) -> None:
        self.calls.pop(call.call_id, None)
        self._metrics.calls.set(len(self.calls))

    async def shutdown(self) -> None:
        self._closing = True
        await asyncio.gather(*(call.end("shutdown") for call in list(self.calls.values())))
