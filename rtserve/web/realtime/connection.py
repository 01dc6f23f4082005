"""One realtime connection: at most one session, opened or resumed on it.

It runs over an ``EventTransport`` (``transport.py``): a WebSocket on ``/v1/realtime`` or
``/v1/duplex``, or a WebRTC call's data channel and media track (``web/webrtc/``).

Two tasks per connection. The receive loop (the handler's own task) parses client
frames in arrival order, decodes audio (``InputAudioDecoder``, resampled to the
engine rate) and submits typed commands; it never waits for output. The sender task
reads the session's attachment and awaits the transport for each event, so a client that
reads slowly only fills its own session's bounded ``OutputBuffer``; overflow closes that
session with ``output_backpressure`` (the session core's policy) and nothing else.

Errors found here (a malformed frame, bad base64) go onto the session's own stream
(``SessionHandle.report``) so they keep their order and sequence numbers; before a
session exists they are sent directly.

A connection whose URL carries ``session_id`` and ``resume`` (``connect_query``) takes
over that session at once instead of opening one; ``session_id`` alone names the session
it opens.

A ``session.resume`` for a session another front-end owns (``web/peers``) is relayed there:
on ``session.resumed`` this connection only copies frames to and from the owner until it
closes; a refusal is passed on and the connection stays sessionless here.

When the socket goes away the attachment detaches: a duplex session waits out its
disconnect grace for a ``session.resume``; a turn-based one closes (``disconnect``).
After the session's last event (``session.closed``/``session.expired``, or
``session.replaced`` when another socket resumed it) the server closes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import WSCloseCode, WSMsgType

from rtserve.codecs.errors import CodecError
from rtserve.codecs.images import ImageError, bounded_url
from rtserve.codecs.pcm import FloatArray
from rtserve.engines.tools import InvalidTools, check_tools
from rtserve.errors import INTERNAL_ERROR, INVALID_VALUE, SESSION_ALREADY_OPEN, SESSION_NOT_OPEN
from rtserve.log import session_id_var
from rtserve.sessions import Attachment, Projection, SessionConfig, SessionError, SessionHandle
from rtserve.sessions import commands as cmd
from rtserve.sessions.events import (
    ErrorEvent,
    SessionClosed,
    SessionEvent,
    SessionExpired,
    SessionReplaced,
    SpeechStarted,
)
from rtserve.sessions.ids import item_id_for_response, new_event_id
from rtserve.sessions.projections import compact_json
from rtserve.sessions.session_config import ConfigUpdateError
from rtserve.web.error_mapping import close_code, realtime_error
from rtserve.web.peers import RelayOutcome
from rtserve.web.realtime.audio import InputAudioDecoder
from rtserve.web.realtime.audio_items import CreateAudioItem, resolve_audio_item
from rtserve.web.realtime.client_events import (
    AppendInput,
    CancelInput,
    ClearInput,
    ClientAction,
    CommitInput,
    EventRules,
    ResumeSession,
    UpdateSession,
    parse_client_event,
)
from rtserve.web.realtime.connect_query import ConnectQuery
from rtserve.web.realtime.errors import WireError, invalid_event
from rtserve.web.realtime.transport import EventTransport
from rtserve.web.realtime.vllm_transcription import TranscriptionFlow

if TYPE_CHECKING:
    from rtserve.web.realtime.service import RealtimeService

log = logging.getLogger(__name__)

_INLINE_DECODE_CHARS = 256 * 1024  # larger frames parse and decode on the codec executor, off the event loop

# Close codes after the session's last event (RFC 6455 §7.4.1).
_CLOSE_FOR_REASON = {
    "shutdown": WSCloseCode.GOING_AWAY,
    INTERNAL_ERROR: WSCloseCode.INTERNAL_ERROR,
    "engine_closed": WSCloseCode.INTERNAL_ERROR,
}

_NO_QUERY = ConnectQuery()  # the URL names no session

# Hands this connection's socket to the front-end that owns a session (``web/peers``): the
# client's ``session.resume`` frame and the owner's tag in, how it went out.
ResumeRelay = Callable[[str, str], Awaitable[RelayOutcome]]


@dataclass(frozen=True)
class Dialect:
    """What one connection speaks, decided from its route, query and headers."""

    route: str
    projection: Projection
    rules: EventRules
    autostart: bool  # open a session on connect (else: wait for session.update / session.resume)
    conversation_created: bool  # turn-based OpenAI route: conversation.created follows session.created

    @property
    def duplex(self) -> bool:
        return self.rules.duplex


class RealtimeConnection:
    def __init__(
        self,
        transport: EventTransport,
        service: RealtimeService,
        dialect: Dialect,
        initial: SessionConfig,
        query: ConnectQuery = _NO_QUERY,
        *,
        relay: ResumeRelay | None = None,
    ) -> None:
        self.transport = transport
        self._query = query  # the URL's session name, or the session it resumes
        self._relay = relay  # None: this transport cannot be relayed to another front-end
        self._relayed = False  # the socket was relayed to the front-end that owns its session
        self.service = service
        self.dialect = dialect
        self._initial = initial  # what a session opened here starts from
        self.handle: SessionHandle | None = None
        self.attachment: Attachment | None = None
        self._config = initial  # the session config as this connection last set it (input decoding)
        self._decoder = InputAudioDecoder(service.engine_capabilities.input_sample_rate)
        self._sender: asyncio.Task[None] | None = None
        self._server_closing = False  # the sender is closing the socket after the session's last event
        self._sending = False  # the sender is waiting for the transport to take an event
        self._transcription = TranscriptionFlow()  # vLLM's transcription events, once a client asks

    async def run(self, opened: SessionHandle | None = None) -> None:
        """Serve until the peer leaves or the session ends. ``opened``: a session the caller
        already admitted (a WebRTC call opens its session before it answers the offer)."""
        try:
            if opened is not None:
                assert opened.attachment is not None
                self._attach(opened, opened.attachment)
            elif self._query.resume is not None:
                if not await self._resume_on_connect(self._query.resume):
                    return
            elif self.dialect.autostart and not await self._open({}, None):
                return
            await self._receive_loop()
        finally:
            await self._finish()

    # ------------------------------------------------------------------ receive

    async def _receive_loop(self) -> None:
        while not self._relayed:
            # Without a session nothing else bounds an idle socket.
            timeout = None if self.handle is not None else self.service.limits.idle_ttl_s
            try:
                async with asyncio.timeout(timeout):
                    message = await self.transport.receive()
            except TimeoutError:
                await self.transport.close(WSCloseCode.OK, "no session was opened")
                return
            if message.type is WSMsgType.TEXT:
                await self._on_text(message.data)
            elif message.type is WSMsgType.BINARY:
                await self._report(invalid_event("events are JSON text frames"))
            else:  # CLOSE / CLOSING / CLOSED / ERROR (e.g. a frame over the size limit: 1009)
                return

    async def _on_text(self, text: str) -> None:
        try:
            if len(text) > _INLINE_DECODE_CHARS:  # a big append: parse it off the event loop too
                action = await self.service.codecs.run(parse_client_event, text, self.dialect.rules)
            else:
                action = parse_client_event(text, self.dialect.rules)
            if isinstance(action, ResumeSession) and await self._resumed_elsewhere(action, text):
                return
            await self._apply(action)
        except WireError as exc:
            await self._report(exc)

    async def _apply(self, action: ClientAction) -> None:
        if isinstance(action, UpdateSession):
            if self.handle is None:
                await self._open(action.changes, action.event_id)
            else:
                await self._update(action)
            return
        if isinstance(action, ResumeSession):
            self._resume(action)
            return
        handle = self.handle
        if handle is None:
            raise WireError(
                SESSION_NOT_OPEN,
                "No session is open on this connection; send session.update (or session.resume) first",
                event_id=getattr(action, "event_id", None),
            )
        if isinstance(action, AppendInput):
            pcm = await self._decode(action)
            handle.submit(cmd.AppendAudio(audio=pcm, is_speech=action.is_speech, event_id=action.event_id))
        elif isinstance(action, CommitInput) and action.final is False:
            if self._transcription.start():  # vLLM: the stream opens; turns end at final: true only
                handle.submit(cmd.SessionUpdate(changes={"turn_detection": None}, event_id=action.event_id))
        elif isinstance(action, CommitInput):
            tail = self._decoder.flush()  # the resampler's held-back end of the turn
            if tail.size:
                handle.submit(cmd.AppendAudio(audio=tail))
            handle.submit(
                cmd.Commit(response_create=action.response_create, is_speech=action.is_speech, event_id=action.event_id)
            )
        elif isinstance(action, ClearInput | CancelInput):
            self._decoder.reset()
            handle.submit(cmd.Clear(target="input", event_id=action.event_id))
            if isinstance(action, CancelInput):
                handle.submit(cmd.Clear(target="output", event_id=action.event_id))
        elif isinstance(action, cmd.ResponseCreate) and action.tools:
            await self._check_response_tools(action)
            handle.submit(action)
        elif (
            isinstance(action, cmd.ConversationItemCreate)
            and action.images
            and self.service.engine_capabilities.supports_vision
        ):
            handle.submit(await self._bounded_images(action))  # a model that cannot see: the session refuses
        elif isinstance(action, CreateAudioItem):  # transcribed first; later frames wait, in order
            handle.submit(
                await resolve_audio_item(
                    action, self.service.asr(), self._config.input_audio_format, self.service.codecs
                )
            )
        else:
            # Refusals of a live session are on its stream; a closed one's stream has ended.
            handle.submit(action)

    async def _bounded_images(self, action: cmd.ConversationItemCreate) -> cmd.ConversationItemCreate:
        """The item with each ``input_image`` checked and re-encoded as a bounded JPEG (docs/video.md)."""
        limits = self.service.config.video_input
        try:
            images = [await self.service.codecs.run(bounded_url, url, limits) for url in action.images]
        except ImageError as exc:
            raise realtime_error(exc, event_id=action.event_id) from None
        return dataclasses.replace(action, images=tuple(images))

    async def _decode(self, action: AppendInput) -> FloatArray:
        fmt = action.audio_format or self._config.input_audio_format
        try:
            if len(action.audio) > _INLINE_DECODE_CHARS:
                return await self.service.codecs.run(self._decoder.decode, action.audio, fmt, action.sample_rate)
            return self._decoder.decode(action.audio, fmt, action.sample_rate)
        except CodecError as exc:
            raise realtime_error(exc, event_id=action.event_id) from None

    async def _update(self, action: UpdateSession) -> None:
        """Validate against the config this connection last set (so the decoder can switch
        format at once), then let the runner apply it and answer ``session.updated``."""
        assert self.handle is not None
        try:
            self._config = await self._updated(self._config, action.changes)
        except ConfigUpdateError as exc:
            raise realtime_error(exc, event_id=action.event_id) from None
        self.handle.submit(cmd.SessionUpdate(changes=action.changes, event_id=action.event_id))

    async def _updated(self, config: SessionConfig, changes: dict[str, Any]) -> SessionConfig:
        """``config`` with ``changes``; with tools on the codec executor, since their schemas
        compile (up to ``sessions.max_tool_schema_bytes``): the runner's own check of the same
        tools then finds the verdicts cached (``rtserve.engines.tools``)."""
        if changes.get("tools"):
            return await self.service.codecs.run(config.updated, changes, self.service.limits)
        return config.updated(changes, self.service.limits)

    async def _check_response_tools(self, action: cmd.ResponseCreate) -> None:
        """A response's own tools, checked (compiled) on the codec executor before the runner
        checks them again against the session's config, from the cache."""
        limits = self.service.limits
        choice = self._config.tool_choice if action.tool_choice is None else action.tool_choice
        try:
            await self.service.codecs.run(
                functools.partial(
                    check_tools,
                    action.tools or (),
                    choice,
                    "response.tools",
                    max_tools=limits.max_tools,
                    max_schema_bytes=limits.max_tool_schema_bytes,
                )
            )
        except InvalidTools as exc:
            raise WireError(INVALID_VALUE, exc.message, param=exc.param, event_id=action.event_id) from None

    # ------------------------------------------------------------------ open / resume

    async def _open(self, changes: dict[str, Any], event_id: str | None) -> bool:
        """Open this connection's session; False when refused (the socket is then closed)."""
        try:
            config = await self._updated(self._initial, changes)
        except ConfigUpdateError as exc:
            await self._report(realtime_error(exc, event_id=event_id))
            return True
        if config.tools and not self.service.engine_capabilities.supports_tools:  # as session.update refuses them
            await self._report(
                WireError(INVALID_VALUE, "This engine cannot call functions", param="session.tools", event_id=event_id)
            )
            return True
        try:
            handle = await self.service.sessions.open(
                config,
                projection=self.dialect.projection,
                resumable=self.dialect.duplex,
                session_id=self._query.session_id,
                route=self.dialect.route,
            )
        except SessionError as exc:
            await self._report(realtime_error(exc, event_id=event_id, opening=True))
            await self.transport.close(close_code(exc), exc.code)
            return False
        if self.transport.closed:  # the client left while the engine was opening
            await handle.close("disconnect")
            return False
        assert handle.attachment is not None
        self._attach(handle, handle.attachment)
        log.info("%s session opened (%s)", self.dialect.route, self.dialect.projection.name)
        return True

    async def _resume_on_connect(self, action: ResumeSession) -> bool:
        """The URL's ``resume``: as a first ``session.resume``; refused -> error, close 1008."""
        try:
            self._resume(action)
        except WireError as exc:
            await self._report(exc)
            await self.transport.close(WSCloseCode.POLICY_VIOLATION, exc.code)
            return False
        return True

    async def _resumed_elsewhere(self, action: ResumeSession, text: str) -> bool:
        """True when another front-end owns the session and answered (relayed, or refused)."""
        peers = self.service.peers
        owner = peers.remote_owner(action.session_id) if peers is not None and self.handle is None else None
        if owner is None or self._relay is None:
            return False
        outcome = await self._relay(text, owner)
        self._relayed = outcome is RelayOutcome.RELAYED
        return outcome is not RelayOutcome.NO_OWNER

    def _resume(self, action: ResumeSession) -> None:
        if self.handle is not None:
            raise WireError(
                SESSION_ALREADY_OPEN,
                "This connection already has a session; resume on a new connection opened with autostart=0",
                event_id=action.event_id,
            )
        manager = self.service.sessions
        try:
            attachment = manager.resume(
                action.session_id,
                resume_token=action.resume_token,
                expected_generation=action.generation,
                control_id=action.event_id or uuid.uuid4().hex,
                last_received_seq=action.last_received_seq,
                projection=self.dialect.projection,
            )
        except SessionError as exc:
            raise realtime_error(exc, event_id=action.event_id) from None
        handle = manager.get(action.session_id)
        assert handle is not None  # resume succeeds only for a live session, and nothing was awaited since
        self._attach(handle, attachment)
        log.info("%s session resumed (generation %d)", self.dialect.route, attachment.generation)

    def _attach(self, handle: SessionHandle, attachment: Attachment) -> None:
        self.handle = handle
        self.attachment = attachment
        self._config = handle.config
        session_id_var.set(handle.session_id)
        self._sender = asyncio.get_running_loop().create_task(
            self._send_events(attachment), name=f"realtime-send:{handle.session_id}"
        )

    # ------------------------------------------------------------------ send

    async def _send_events(self, attachment: Attachment) -> None:
        last: SessionEvent | None = None
        try:
            async for delivery in attachment.deliveries():
                self._sending = True
                await self.transport.deliver(delivery)
                for frame in self._transcription.frames_after(delivery.event):
                    await self.transport.send_text(frame)
                self._sending = False
                if last is None and self.dialect.conversation_created:
                    await self.transport.send_text(self._conversation_created())
                if isinstance(delivery.event, SpeechStarted) and self._interrupts():
                    await self.interrupt_playback()
                last = delivery.event
        except ConnectionError:
            return  # the socket is gone; the receive loop detaches
        if isinstance(last, SessionClosed | SessionExpired):
            self._server_closing = True
            await self.transport.close(_CLOSE_FOR_REASON.get(last.reason, WSCloseCode.OK), last.reason)
        elif isinstance(last, SessionReplaced):
            self._server_closing = True
            await self.transport.close(WSCloseCode.OK, "session resumed on another connection")

    def _interrupts(self) -> bool:
        vad = self.handle.config.turn_detection if self.handle is not None else None
        return vad is not None and vad.interrupt_response

    async def interrupt_playback(self) -> None:
        """Drop the agent audio the transport still holds (the user spoke over it, or a WebRTC
        client's ``output_audio_buffer.clear``). A response cut off after it ended in the
        session keeps, in the conversation, only the audio that was played
        (``conversation.item.truncated``), as OpenAI's WebRTC server does: the transport, not
        the client, knows what was heard."""
        for cut in await self.transport.interrupt_playback():
            handle = self.handle
            if handle is None or handle.active_response_id == cut.response_id:
                continue  # still generating: the session's own cancel or fence applies
            handle.submit(
                cmd.ConversationItemTruncate(item_id=item_id_for_response(cut.response_id), audio_end_ms=cut.heard_ms)
            )

    def _conversation_created(self) -> str:
        return compact_json(
            {
                "type": "conversation.created",
                "event_id": new_event_id(),
                "conversation": {"id": f"conv_{uuid.uuid4().hex[:24]}", "object": "realtime.conversation"},
            }
        )

    async def _report(self, exc: WireError) -> None:
        """An error event: on the session's stream when there is one, else straight out."""
        self.service.metrics.client_errors.labels(exc.code).inc()
        error = ErrorEvent(
            session_id=self.handle.session_id if self.handle is not None else "",
            code=exc.code,
            message=exc.message,
            error_type=exc.error_type,
            param=exc.param,
            related_event_id=exc.event_id,
        )
        if self.handle is not None:
            self.handle.report(error)  # False once the session ended: nothing may follow its last event
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.transport.send_text(self.dialect.projection.render_text(error))

    # ------------------------------------------------------------------ end

    async def _finish(self) -> None:
        if self.attachment is not None:
            # Refused (False) when the session already ended or moved to another socket.
            self.attachment.detach()
        if self._sender is not None:
            if not self._server_closing:  # else let it finish the close handshake (bounded by the ws timeout)
                self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
            if self._sending:  # the peer stopped reading
                self.transport.abort()
        if not self.transport.closed:
            await self.transport.close(WSCloseCode.OK, "")
