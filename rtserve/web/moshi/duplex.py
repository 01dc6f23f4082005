"""``WS /v1/audio/duplex``: PersonaPlex's raw-PCM dialect (docs/peers.md#personaplex).

* client ``{"type":"open","persona":...,"voice":...,"seed":...}`` -> server ``{"type":"ready"}``
  once the engine slot is ready; a second ``open`` -> error ``session already open``;
* binary messages both ways: little-endian float32 PCM, 24 kHz mono (any length in;
  the engine frames it at each tick). Binary before ``open`` is ignored, as in PersonaPlex's
  batched server;
* server ``{"type":"text","text":...}`` for the agent's text;
* client ``{"type":"close"}`` -> the tail is stepped (zero-padded), the engine's answer
  to it is forwarded (an explicit drain, bounded by ``moshi.flush_timeout_s``), then
  ``{"type":"done"}`` and a normal close.

Deadlines (``deadlines.py``): no valid ``open`` within ``moshi.open_timeout_s`` of connecting,
or no audio for ``moshi.idle_timeout_s`` on an open conversation, closes the socket (1000 and
the reason); a reader that takes nothing for ``moshi.send_timeout_s`` (agent audio, ``done``
or the close frame) loses the connection.

Bad input (malformed JSON, an unknown type, a refused voice, misaligned or non-finite
PCM) gets ``{"type":"error","error":<message>,"code":<stable code>}`` and the
connection stays usable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated, Literal

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from rtserve import untrusted_json
from rtserve.codecs.errors import CodecError
from rtserve.codecs.pcm import f32le_to_float, float_to_f32le
from rtserve.engines.values import SlotPrompt
from rtserve.errors import INVALID_JSON, INVALID_MESSAGE, SESSION_ALREADY_OPEN, UNKNOWN_MESSAGE_TYPE, RtserveError
from rtserve.web.error_mapping import moshi_error_message
from rtserve.web.moshi.bridge import AgentFrame
from rtserve.web.moshi.deadlines import ReceiveDeadline, close_within, receive_before, send_within
from rtserve.web.moshi.prompt import UNSEEDED, PromptQueryError, parse_seed, resolve_voice
from rtserve.web.moshi.service import ChatBridge, MoshiService

log = logging.getLogger(__name__)

ROUTE = "/v1/audio/duplex"


class OpenMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["open"]
    persona: str | None = None
    voice: str | None = None
    seed: Annotated[StrictInt, Field(ge=UNSEEDED, lt=2**63)] | None = None  # -1: unseeded, as on /api/chat


class CloseMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["close"]


_CLIENT_MESSAGE: TypeAdapter[OpenMessage | CloseMessage] = TypeAdapter(
    Annotated[OpenMessage | CloseMessage, Field(discriminator="type")]
)


class ClientError(RtserveError):
    """Bad client input answered with an error event; the connection stays open."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code=code)


def parse_client_message(text: str) -> OpenMessage | CloseMessage:
    try:
        data = untrusted_json.loads(text)
    except ValueError:
        raise ClientError("message is not valid JSON", INVALID_JSON) from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ClientError("message must be a JSON object with a string 'type'", INVALID_MESSAGE)
    if data["type"] not in ("open", "close"):
        raise ClientError(f"unknown message type {data['type'][:64]!r}", UNKNOWN_MESSAGE_TYPE)
    try:
        return _CLIENT_MESSAGE.validate_python(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"][1:]) or "message"
        raise ClientError(f"invalid '{field}': {err['msg']}", INVALID_MESSAGE) from None


class DuplexConnection:
    """One ``/v1/audio/duplex`` socket: at most one conversation, opened by ``open``."""

    def __init__(self, ws: web.WebSocketResponse, transport: asyncio.Transport | None, service: MoshiService) -> None:
        self.ws = ws
        self.transport = transport
        self.service = service
        self.settings = service.config.moshi
        self.deadline = ReceiveDeadline.after(
            self.settings.open_timeout_s, f"open timeout: no 'open' within {self.settings.open_timeout_s:g} s"
        )
        self.conversation: ChatBridge | None = None
        self._output: asyncio.Task[None] | None = None
        self._live = contextlib.AsyncExitStack()  # the open conversation's gauge and slot release

    async def run(self) -> None:
        try:
            while (
                message := await receive_before(self.ws, self.deadline, self.transport, self.settings.send_timeout_s)
            ) is not None:
                if message.type is WSMsgType.TEXT:
                    finished = await self._on_text(message.data)
                    if finished:
                        return
                elif message.type is WSMsgType.BINARY:
                    await self._on_audio(message.data)
                elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    return
        finally:
            await self._end_conversation()

    async def _on_text(self, text: str) -> bool:
        """Handle one JSON message; True once the connection is finished."""
        try:
            message = parse_client_message(text)
            if isinstance(message, OpenMessage):
                return await self._open(message)
            await self._close()
            return True
        except ClientError as exc:
            await self._send_error(exc)
            return False

    async def _open(self, message: OpenMessage) -> bool:
        if self.conversation is not None:
            raise ClientError("session already open", SESSION_ALREADY_OPEN)
        try:
            prompt = SlotPrompt(
                text=message.persona or None,
                voice=resolve_voice(message.voice, self.service.config.models.voice_prompt_dir),
                seed=parse_seed(message.seed),
            )
        except PromptQueryError as exc:
            raise ClientError(str(exc), exc.code) from None
        conversation = await self.service.open_conversation(self.ws, ROUTE, prompt)
        if conversation is None:
            return True  # open_conversation closed the socket with its reason
        self.conversation = conversation
        await self._live.enter_async_context(self.service.live(ROUTE, conversation))
        try:
            await self.ws.send_json({"type": "ready"})
        except ConnectionError:
            return True
        self._output = self.service.spawn_output(self.ws, self.transport, ROUTE, conversation, self._send_frame)
        self._heard_audio()
        return False

    async def _on_audio(self, data: bytes) -> None:
        if self.conversation is None:
            return  # before 'open': ignored, as PersonaPlex's batched server does
        try:
            pcm = f32le_to_float(data)
        except CodecError as exc:
            await self._send_error(exc)
            return
        self.conversation.push(pcm)
        self._heard_audio()

    def _heard_audio(self) -> None:
        timeout_s = self.settings.idle_timeout_s
        self.deadline = ReceiveDeadline.after(timeout_s, f"idle timeout: no audio for {timeout_s:g} s")

    async def _close(self) -> None:
        """``close``: drain (tail stepped, its answer read), then ``done``."""
        conversation = self.conversation
        if conversation is not None:
            timeout_s = self.settings.flush_timeout_s
            if not await conversation.drain(timeout_s):
                log.warning("drain did not finish within %.1fs", timeout_s)
            await conversation.close()  # ends the engine's events: the output task sends the frame it holds
            if self._output is not None:
                await asyncio.gather(self._output, return_exceptions=True)
        send_timeout_s = self.settings.send_timeout_s
        try:
            if not await send_within(self.ws.send_json({"type": "done"}), self.transport, send_timeout_s):
                return
        except ConnectionError:
            return
        await close_within(self.ws, self.transport, WSCloseCode.OK, "done", send_timeout_s)

    async def _end_conversation(self) -> None:
        if self._output is not None:
            await self.service.stop_output(self._output)
        await self._live.aclose()

    async def _send_frame(self, frame: AgentFrame) -> None:
        if frame.pcm.size:
            await self.ws.send_bytes(float_to_f32le(frame.pcm))
        if frame.text:
            await self.ws.send_json({"type": "text", "text": frame.text})

    async def _send_error(self, exc: RtserveError) -> None:
        with contextlib.suppress(ConnectionError):  # the client is gone: nobody to tell
            await self.ws.send_json(moshi_error_message(exc))


async def handle_duplex(request: web.Request, service: MoshiService) -> web.WebSocketResponse:
    ws = service.websocket(request)
    await ws.prepare(request)
    async with service.connections.track(ws):
        await DuplexConnection(ws, request.transport, service).run()
    return ws
