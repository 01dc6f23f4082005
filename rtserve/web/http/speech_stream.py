"""``WS /v1/audio/speech/stream``: text streamed in, speech streamed out (docs/serving.md#streaming-speech).

Client events (JSON text frames):

* ``session.config`` ``{voice, response_format, speed, model}``: sticky for the connection
  (defaults: the engine's voice, ``pcm``, 1.0); refused with ``session_busy`` while text
  is still waiting to be spoken;
* ``input.text`` ``{text}``: a delta of the text to speak; every sentence (or clause, past
  a length) it completes goes to the TTS at once (``engines/cascade/sentences.py``);
* ``input.done``: flush: the unfinished tail is spoken too, then ``session.done`` ends
  the utterance; the connection stays open for the next one;
* ``cancel``: barge-in: text not yet spoken, queued sentences and the sentence being
  synthesized are dropped at once; ``cancelled`` confirms, and no audio of the cancelled
  utterance follows it;
* ``session.close``: finish what is queued, then close (1000).

Server events: ``session.updated`` ``{config}``; per sentence ``audio.start``
``{utterance_index, sentence_index, sentence_text, format, sample_rate}``, binary frames
of audio as the engine produces them (``pcm``: 16-bit LE at 24 kHz; other formats: one
complete file per sentence), ``audio.done`` ``{..., total_bytes, error}``; ``session.done``
``{utterance_index, total_sentences}``; ``cancelled``; ``error`` ``{message, code, param}``.
A synthesis failure's ``error`` carries ``"action": "discard"`` (docs/serving.md#speech): audio
already sent for that sentence is incomplete and must be dropped.

Bounds (``speech_stream.*``): text waiting to be spoken and queued sentences (beyond:
``input_backpressure``, that text dropped, the connection stays), one event's size (close
1009), open sockets (1013), idle time (1000). A reader that stops reading is dropped once
a write has waited ``send_timeout_s``: the speaker blocks on the socket (nothing queues up
behind it), and an utterance's audio goes out at most ``max_audio_ahead_s`` ahead of real time,
so what waits in the socket buffers for a reader at playback pace is that much.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from rtserve import untrusted_json
from rtserve.config import SpeechStreamConfig
from rtserve.engines.audio_pace import AudioPace
from rtserve.engines.cascade.sentences import SentenceSplitter, speakable
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import TTSEngine
from rtserve.engines.voice_names import OPENAI_VOICES
from rtserve.errors import INPUT_BACKPRESSURE, INVALID_EVENT, INVALID_JSON, INVALID_VOICE, SESSION_BUSY, RtserveError
from rtserve.web.connections import Connections, close_socket
from rtserve.web.context import CTX
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.audio import SPEECH_SAMPLE_RATE
from rtserve.web.http.common import require_tts
from rtserve.web.http.speech import SpeechPipeline
from rtserve.web.http.speech_stream_events import (
    Close,
    Item,
    Sentence,
    StreamConfig,
    StreamError,
    TextEvent,
    UtteranceEnd,
    parse_event,
)
from rtserve.web.moshi.deadlines import send_within

log = logging.getLogger(__name__)

ROUTE = "/v1/audio/speech/stream"
DISCARD = "discard"


class SpeechStream:
    """One connection: the handler reads events; one speaker task owns the TTS and writes audio."""

    def __init__(
        self, ws: web.WebSocketResponse, request: web.Request, tts: TTSEngine, limits: SpeechStreamConfig
    ) -> None:
        self._ws = ws
        self._ctx = request.app[CTX]
        self._tts = tts
        self._limits = limits
        self._transport = request.transport
        self._config = StreamConfig()
        self._splitter = SentenceSplitter()
        self._queue: deque[Item] = deque()
        self._queued_sentences = 0
        self._item_ready = asyncio.Event()
        self._pending_chars = 0  # received and not yet spoken (or dropped)
        self._utterance = 0
        self._sentence = 0  # next sentence index within the utterance
        self._speaking = False
        self._speaker: asyncio.Task[None] | None = None
        self._dropped = False  # the reader stalled: the connection was dropped
        self._pace: tuple[int, AudioPace] | None = None  # the utterance being spoken and its pace

    # ------------------------------------------------------------------ reading

    async def run(self) -> None:
        self._speaker = asyncio.create_task(self._speak_loop())
        try:
            while not self._ws.closed and not self._dropped:
                try:
                    message = await self._ws.receive(timeout=self._limits.idle_timeout_s)
                except TimeoutError:
                    if self._busy:
                        continue
                    await close_socket(self._ws, WSCloseCode.OK, "idle timeout")
                    return
                if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    return
                try:
                    if await self._handle(message):
                        return
                except StreamError as exc:
                    await self._send_error(exc)
        finally:
            await self._stop_speaker()

    @property
    def _busy(self) -> bool:
        return self._speaking or bool(self._queue) or self._pending_chars > 0

    async def _handle(self, message: Any) -> bool:
        """Apply one client event; True once the connection should end."""
        if message.type is not WSMsgType.TEXT:
            raise StreamError("send JSON text events; this route takes no binary input", code=INVALID_EVENT)
        try:
            event = untrusted_json.loads(message.data)
        except ValueError:
            raise StreamError("the event is not valid JSON", code=INVALID_JSON) from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise StreamError("an event is a JSON object with a string 'type'", code=INVALID_EVENT, param="type")
        kind = event["type"]
        if kind == "session.config":
            await self._configure(event)
        elif kind == "input.text":
            self._add_text(parse_event(TextEvent, event).text)
        elif kind == "input.done":
            self._flush()
        elif kind == "cancel":
            await self._cancel()
        elif kind == "session.close":
            self._flush(end_utterance=False)
            self._enqueue(Close())
            if self._speaker is not None:
                await asyncio.shield(self._speaker)
            await close_socket(self._ws, WSCloseCode.OK, "session closed")
            return True
        else:
            raise StreamError(f"unknown event type {kind!r}", code=INVALID_EVENT, param="type")
        return False

    async def _configure(self, event: dict[str, Any]) -> None:
        if self._busy:
            raise StreamError(
                "session.config is refused while text is waiting to be spoken; send input.done "
                "and wait for session.done, or cancel",
                code=SESSION_BUSY,
            )
        config = parse_event(StreamConfig, event)
        try:
            tts = require_tts(self._ctx, config.model)
        except ApiError as exc:
            raise StreamError(exc.message, code=exc.code, param=exc.param) from None
        if config.voice_name is not None:
            voices = await _voice_names(tts)
            if config.voice_name not in voices:
                raise StreamError(
                    f"unknown voice {config.voice_name!r}; GET /v1/audio/voices lists the voices",
                    code=INVALID_VOICE,
                    param="voice",
                )
        self._tts, self._config = tts, config
        await self._send_json({"type": "session.updated", "config": config.public()})

    def _add_text(self, text: str) -> None:
        if self._pending_chars + len(text) > self._limits.max_buffered_chars:
            raise StreamError(
                f"more than {self._limits.max_buffered_chars} characters are waiting to be spoken; "
                "this text was dropped (speech_stream.max_buffered_chars)",
                code=INPUT_BACKPRESSURE,
            )
        sentences = self._splitter.feed(text)
        if self._queued_sentences + len(sentences) > self._limits.max_queued_sentences:
            self._splitter = SentenceSplitter()  # the dropped text must not resurface with the next delta
            self._pending_chars = sum(len(item.text) for item in self._queue if isinstance(item, Sentence))
            raise StreamError(
                f"more than {self._limits.max_queued_sentences} sentences are waiting for the "
                "speech engine; this text was dropped (speech_stream.max_queued_sentences)",
                code=INPUT_BACKPRESSURE,
            )
        self._pending_chars += len(text)
        for sentence in sentences:
            self._enqueue_sentence(sentence)

    def _flush(self, end_utterance: bool = True) -> None:
        if tail := self._splitter.flush():
            self._enqueue_sentence(tail)
        if end_utterance:
            self._enqueue(UtteranceEnd(self._utterance, self._sentence))
            self._utterance += 1
            self._sentence = 0
        self._pending_chars = sum(len(item.text) for item in self._queue if isinstance(item, Sentence))

    def _enqueue_sentence(self, text: str) -> None:
        if spoken := speakable(text):
            self._enqueue(Sentence(self._utterance, self._sentence, spoken))
            self._sentence += 1

    def _enqueue(self, item: Item) -> None:
        self._queue.append(item)
        self._queued_sentences += isinstance(item, Sentence)
        self._item_ready.set()

    async def _cancel(self) -> None:
        """Barge-in: stop speaking now and forget everything not yet spoken."""
        dropped = self._queued_sentences + self._speaking
        await self._stop_speaker()
        self._queue.clear()
        self._queued_sentences = 0
        self._splitter = SentenceSplitter()
        self._pending_chars = 0
        cancelled = self._utterance
        self._utterance += 1
        self._sentence = 0
        await self._send_json({"type": "cancelled", "utterance_index": cancelled, "dropped_sentences": dropped})
        self._speaker = asyncio.create_task(self._speak_loop())

    async def _stop_speaker(self) -> None:
        if self._speaker is not None:
            self._speaker.cancel()
            await asyncio.gather(self._speaker, return_exceptions=True)
            self._speaker = None
        self._speaking = False

    # ------------------------------------------------------------------ speaking

    async def _speak_loop(self) -> None:
        try:
            await self._speak_items()
        except ConnectionError:
            self._dropped = True  # the client went away mid-write
        except Exception:
            log.exception("speech stream speaker failed")
            self._dropped = True
            await close_socket(self._ws, WSCloseCode.INTERNAL_ERROR, "internal error")

    async def _speak_items(self) -> None:
        while True:
            while not self._queue:
                self._item_ready.clear()
                await self._item_ready.wait()
            item = self._queue.popleft()
            if isinstance(item, Close):
                return
            if isinstance(item, UtteranceEnd):
                await self._send_json(
                    {"type": "session.done", "utterance_index": item.utterance, "total_sentences": item.sentences}
                )
                continue
            self._queued_sentences -= 1
            self._speaking = True
            try:
                await self._speak(item)
            finally:
                self._speaking = False
                self._pending_chars = max(0, self._pending_chars - len(item.text))
            if self._dropped:
                return

    async def _speak(self, sentence: Sentence) -> None:
        config = self._config
        where = {"utterance_index": sentence.utterance, "sentence_index": sentence.index}
        await self._send_json(
            {
                "type": "audio.start",
                **where,
                "sentence_text": sentence.text,
                "format": config.response_format,
                "sample_rate": SPEECH_SAMPLE_RATE,
            }
        )
        pipeline = SpeechPipeline(self._ctx.codecs, self._tts.sample_rate, config.response_format)
        pace = self._utterance_pace(sentence.utterance)
        sent = 0
        try:
            async with contextlib.aclosing(
                self._tts.synthesize(sentence.text, voice=config.voice_name, speed=config.speed)
            ) as chunks:
                async for pcm in chunks:
                    await pace.hold(len(pcm))
                    sent += await self._send_audio(await pipeline.encode(pcm))
            sent += await self._send_audio(await pipeline.finish())
        except EngineError as exc:
            log.info("streamed speech failed: %s", exc)
            await self._send_error(exc, action=DISCARD, **where)
            await self._send_json({"type": "audio.done", **where, "total_bytes": sent, "error": exc.message})
            return
        await self._send_json({"type": "audio.done", **where, "total_bytes": sent, "error": None})

    def _utterance_pace(self, utterance: int) -> AudioPace:
        """The pace of ``utterance``'s audio (docs/serving.md#streaming-speech), from its first sentence on."""
        if self._pace is None or self._pace[0] != utterance:
            self._pace = (utterance, AudioPace(self._limits.max_audio_ahead_s, self._tts.sample_rate))
        return self._pace[1]

    # ------------------------------------------------------------------ writing

    async def _send_audio(self, data: bytes) -> int:
        if data:
            await self._send(self._ws.send_bytes(data))
        return len(data)

    async def _send_json(self, event: dict[str, Any]) -> None:
        await self._send(self._ws.send_str(json.dumps(event, separators=(",", ":"))))

    async def _send(self, send: Any) -> None:
        if self._dropped or self._ws.closed:
            send.close()
            return
        if not await send_within(send, self._transport, self._limits.send_timeout_s):
            self._dropped = True

    async def _send_error(self, exc: RtserveError, **extra: Any) -> None:
        error = api_error(exc).body()["error"]
        await self._send_json(
            {
                "type": "error",
                "message": error["message"],
                "code": error["code"],
                "param": error["param"],
                "error": error,
                **extra,
            }
        )


async def _voice_names(tts: TTSEngine) -> set[str]:
    try:
        return {v.name for v in await tts.voice_list()} | OPENAI_VOICES
    except EngineError:
        return set(tts.voices) | OPENAI_VOICES


STREAMS = web.AppKey("speech_streams", Connections)


async def speech_stream(request: web.Request) -> web.WebSocketResponse:
    ctx = request.app[CTX]
    limits = ctx.config.speech_stream
    tts = require_tts(ctx, request.query.get("model"))  # before the upgrade: a plain HTTP error
    connections = request.app[STREAMS]
    # No pings (docs/serving.md#tts-streaming): an idle client is ended by idle_timeout_s, one
    # that stops reading by send_timeout_s.
    ws = web.WebSocketResponse(max_msg_size=limits.max_event_bytes, heartbeat=None)
    await ws.prepare(request)
    if connections.closing or connections.count >= limits.max_connections:
        await close_socket(
            ws,
            WSCloseCode.TRY_AGAIN_LATER,
            "too many speech streams" if not connections.closing else "server shutting down",
        )
        return ws
    async with connections.track(ws):
        await SpeechStream(ws, request, tts, limits).run()
    return ws


async def _close_streams(app: web.Application) -> None:
    await app[STREAMS].close_all()


def setup(app: web.Application) -> None:
    app[STREAMS] = Connections("speech stream", app[CTX].config.sessions.shutdown_timeout_s)
    app.router.add_get(ROUTE, speech_stream)
    app.on_shutdown.append(_close_streams)
