"""``POST /v1/audio/speech``: text in, audio streamed out while the TTS engine speaks.

* ``stream_format: "audio"`` (default): the encoded file as a chunked body, first bytes
  as soon as the first chunk of speech exists (WAV carries an unknown-length header).
* ``stream_format: "sse"``: ``speech.audio.delta`` events with base64 pieces of the same
  encoded file, then ``speech.audio.done`` with usage.

An engine failure before any audio gives an HTTP error; after audio has gone out, an SSE
stream gets a ``speech.audio.error`` event and a raw stream is cut short (no final chunk),
so the client sees an incomplete body rather than a file that silently ends early.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rtserve.codecs.resample import StreamResampler
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import TTSEngine
from rtserve.engines.values import Pcm
from rtserve.errors import INVALID_VALUE
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.context import CTX
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.audio import CONTENT_TYPES, SPEECH_SAMPLE_RATE, SpeechEncoder, SpeechFormat, open_speech_encoder
from rtserve.web.http.common import (
    SseStream,
    first_item,
    generation_route,
    read_json,
    require_tts,
    run_generation,
)

log = logging.getLogger(__name__)


class VoiceRef(BaseModel):
    """The SDK's custom-voice form ``{"id": "..."}``."""

    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str = Field(min_length=1)
    model: str | None = None
    voice: str | VoiceRef | None = None
    response_format: SpeechFormat = "mp3"  # OpenAI's default
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = None  # accepted for compatibility; the embedded TTS has no style control

    @field_validator("input")
    @classmethod
    def _speakable(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("input must contain text to speak")
        return text

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


@generation_route
async def create_speech(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    body = await read_json(request, SpeechRequest)
    limit = ctx.config.http.max_speech_input_chars
    if len(body.input) > limit:
        raise ApiError(
            f"Invalid value for 'input': at most {limit} characters are allowed.", param="input", code=INVALID_VALUE
        )
    tts = require_tts(ctx, body.model)  # the engine itself judges ``voice`` (it knows its aliases)
    speech_id = f"speech-{uuid.uuid4().hex}"
    return await run_generation(request, speech_id, functools.partial(_speak, request, tts, body))


class SpeechPipeline:
    """Engine PCM -> 24 kHz -> encoded bytes; resampling and encoding run on the codec executor."""

    def __init__(self, codecs: CodecExecutor, engine_rate: int, response_format: SpeechFormat) -> None:
        self._codecs = codecs
        self._resampler = StreamResampler(engine_rate, SPEECH_SAMPLE_RATE)
        self._encoder: SpeechEncoder = open_speech_encoder(response_format)
        self.samples_out = 0

    async def encode(self, pcm: Pcm) -> bytes:
        return await self._codecs.run(self._encode_sync, pcm)

    async def finish(self) -> bytes:
        return await self._codecs.run(self._finish_sync)

    def _encode_sync(self, pcm: Pcm) -> bytes:
        resampled = self._resampler.process(np.asarray(pcm, dtype=np.float32).reshape(-1))
        self.samples_out += resampled.size
        return self._encoder.encode(resampled)

    def _finish_sync(self) -> bytes:
        tail = self._resampler.flush()
        self.samples_out += tail.size
        return self._encoder.encode(tail) + self._encoder.finish()


async def _speak(request: web.Request, tts: TTSEngine, body: SpeechRequest) -> web.StreamResponse:
    pipeline = SpeechPipeline(request.app[CTX].codecs, tts.sample_rate, body.response_format)
    async with contextlib.aclosing(tts.synthesize(body.input, voice=body.voice_name, speed=body.speed)) as chunks:
        first = await first_item(chunks)
        if body.stream_format == "sse":
            return await _stream_sse(request, chunks, first, pipeline, body)
        return await _stream_audio(request, chunks, first, pipeline, body.response_format)


async def _stream_audio(
    request: web.Request,
    chunks: AsyncIterator[Pcm],
    first: Pcm | None,
    pipeline: SpeechPipeline,
    response_format: SpeechFormat,
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[response_format]})
    response.enable_chunked_encoding()
    await response.prepare(request)
    pcm = first
    try:
        while pcm is not None:
            data = await pipeline.encode(pcm)
            if data:
                await response.write(data)
            pcm = await anext(chunks, None)
    except EngineError as exc:
        log.warning("speech failed after audio was sent; cutting the response short: %s", exc)
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write(await pipeline.finish())
    await response.write_eof()
    return response


async def _stream_sse(
    request: web.Request, chunks: AsyncIterator[Pcm], first: Pcm | None, pipeline: SpeechPipeline, body: SpeechRequest
) -> web.StreamResponse:
    sse = SseStream(request)
    await sse.start()
    pcm = first
    try:
        while pcm is not None:
            data = await pipeline.encode(pcm)
            if data:
                await sse.send({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            pcm = await anext(chunks, None)
    except EngineError as exc:
        log.warning("speech failed mid-stream: %s", exc)
        await sse.send({"type": "speech.audio.error", **api_error(exc).body()})
        return await sse.finish()
    tail = await pipeline.finish()
    if tail:
        await sse.send({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
    # The embedded TTS has no token counts: input is counted in characters, output in 24 kHz samples.
    usage = {
        "input_tokens": len(body.input),
        "output_tokens": pipeline.samples_out,
        "total_tokens": len(body.input) + pipeline.samples_out,
    }
    await sse.send({"type": "speech.audio.done", "usage": usage})
    return await sse.finish()


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", create_speech)
