"""``WS /api/chat``: the Moshi / PersonaPlex binary protocol (docs/peers.md#moshi, docs/peers.md#personaplex).

Every binary message starts with a tag byte:

* server -> client ``0x00``: handshake, sent once the engine slot is ready (after the
  voice/persona prefill);
* client -> server ``0x01`` + Ogg-Opus pages of 24 kHz mono microphone audio;
* server -> client ``0x01`` + Ogg-Opus pages of agent audio (one page per engine frame,
  sent as soon as the frame exists) and ``0x02`` + a UTF-8 text piece.

Unknown tags and text messages are ignored (the protocol says to discard them); only audio
holds the slot: none for ``moshi.idle_timeout_s`` closes the socket (``deadlines.py``). Audio
decoded faster than ``codecs.max_decoded_audio_ratio`` closes it with 1008. Query
parameters (PersonaPlex's: ``text_prompt``, ``voice_prompt``, ``seed``, the sampling
temperatures and top-k; ``prompt.py``) condition the slot; a bad one closes with 1008. Decoded
audio goes to the engine as it arrives; the slot frames it at each tick, so a page is
stepped at the next tick whatever its size.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from rtserve.codecs.decode_rate import DecodeRateError, DecodeRateLimit
from rtserve.codecs.errors import CodecError
from rtserve.codecs.oggopus import OggOpusReader, OggOpusWriter
from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.connections import close_socket
from rtserve.web.context import CTX
from rtserve.web.error_mapping import close_code
from rtserve.web.moshi.bridge import AgentFrame
from rtserve.web.moshi.deadlines import ReceiveDeadline, receive_before
from rtserve.web.moshi.prompt import PromptQueryError, prompt_from_query
from rtserve.web.moshi.service import ChatBridge, MoshiService

log = logging.getLogger(__name__)

ROUTE = "/api/chat"
TAG_HANDSHAKE = b"\x00"
TAG_AUDIO = 0x01
TAG_TEXT = b"\x02"
# One Opus packet per 80 ms engine frame: what Moshi's own clients send and expect.
OPUS_FRAME_MS = 80


async def handle_chat(request: web.Request, service: MoshiService) -> web.WebSocketResponse:
    codecs = request.app[CTX].codecs
    ws = service.websocket(request)
    await ws.prepare(request)
    transport = request.transport
    async with service.connections.track(ws):
        try:
            prompt = prompt_from_query(request.query, service.config.models.voice_prompt_dir)
        except PromptQueryError as exc:
            service.metrics.connections_total.labels(ROUTE, "refused").inc()
            await close_socket(ws, close_code(exc), str(exc))
            return ws
        conversation = await service.open_conversation(ws, ROUTE, prompt)
        if conversation is None:
            return ws
        async with service.live(ROUTE, conversation):
            settings = service.config.moshi
            writer = OggOpusWriter(
                WIRE_SAMPLE_RATE,
                frame_ms=OPUS_FRAME_MS,
                bitrate=settings.opus_bitrate,
                application=settings.opus_application,
                complexity=settings.opus_complexity,
            )

            async def send_frame(frame: AgentFrame) -> None:
                if frame.pcm.size:
                    # One engine frame encodes in ~0.1-0.3 ms (under the ~1 ms bar for the codec executor,
                    # docs/design.md#nothing-blocks-the-event-loop): on the loop it saves two thread hops and
                    # GIL hand-offs a frame.
                    pages = writer.write(frame.pcm)
                    if pages:
                        await ws.send_bytes(bytes((TAG_AUDIO,)) + pages)
                if frame.text:
                    await ws.send_bytes(TAG_TEXT + frame.text.encode("utf-8"))

            try:
                await ws.send_bytes(TAG_HANDSHAKE)
            except ConnectionError:
                return ws
            output = service.spawn_output(ws, transport, ROUTE, conversation, send_frame)
            try:
                await _receive_audio(ws, transport, service, codecs, conversation)
            finally:
                await service.stop_output(output)
    return ws


async def _receive_audio(
    ws: web.WebSocketResponse,
    transport: asyncio.Transport | None,
    service: MoshiService,
    codecs: CodecExecutor,
    conversation: ChatBridge,
) -> None:
    """Client messages until the socket closes; malformed audio, audio decoded too fast or
    none for ``moshi.idle_timeout_s`` closes this socket only."""
    limits, settings = service.config.codecs, service.config.moshi
    rate_limit = DecodeRateLimit(limits.max_decoded_audio_ratio, limits.decoded_audio_burst_s)
    reader = OggOpusReader(
        WIRE_SAMPLE_RATE,
        max_page_bytes=limits.ogg_max_page_bytes,
        max_packet_bytes=limits.ogg_max_packet_bytes,
        max_feed_seconds=limits.ogg_max_feed_audio_s,
        rate_limit=rate_limit,
    )
    idle_reason = f"idle timeout: no audio for {settings.idle_timeout_s:g} s"
    deadline = ReceiveDeadline.after(settings.idle_timeout_s, idle_reason)
    while (message := await receive_before(ws, deadline, transport, settings.send_timeout_s)) is not None:
        if message.type is WSMsgType.BINARY:
            data: bytes = message.data
            if len(data) < 2 or data[0] != TAG_AUDIO:
                continue  # unknown tags are discarded; an empty audio message carries nothing
            try:
                pcm = await _decode(reader, data[1:], codecs, settings.inline_decode_packets, limits.ogg_max_page_bytes)
            except CodecError as exc:
                log.info("closing: refused Ogg-Opus from client (%s: %s)", exc.code, exc)
                code = WSCloseCode.POLICY_VIOLATION if isinstance(exc, DecodeRateError) else close_code(exc)
                await close_socket(ws, code, f"{exc.code}: {exc}")
                return
            conversation.push(pcm)
            deadline = ReceiveDeadline.after(settings.idle_timeout_s, idle_reason)
        elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return
        # TEXT: not part of the protocol, discarded like unknown tags


async def _decode(
    reader: OggOpusReader, payload: bytes, codecs: CodecExecutor, inline_packets: int, inline_bytes: int
) -> FloatArray:
    """A client message's audio. What live clients send (a page or two per 80 ms frame) decodes
    on the loop, saving two thread hops a message; a message over ``inline_bytes`` (one Ogg
    page) or of more than ``inline_packets`` Opus packets (each up to 120 ms of audio) could
    hold the loop and decodes on the codec executor."""
    if len(payload) > inline_bytes:
        return await codecs.run(reader.feed, payload)
    pages = reader.read_pages(payload)
    if sum(page.packets_ending for page in pages) <= inline_packets:
        return reader.decode(pages)
    return await codecs.run(reader.decode, pages)
