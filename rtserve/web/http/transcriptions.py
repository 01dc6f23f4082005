"""``POST /v1/audio/transcriptions``: an audio file in (multipart), text out.

The upload may be any container/codec FFmpeg decodes; it is downmixed and resampled to
the ASR engine's rate. ``response_format`` json/text/verbose_json/srt/vtt; ``stream=true``
sends ``transcript.text.delta`` events as the engine's transcript grows, then
``transcript.text.done`` with the final transcript.

Long files go to the engine in windows (``http.transcription_window_s``, Whisper's 30 s
by default) cut at the quietest moment near each boundary, one engine call per window:
the cost stays linear in the length and a conversational ASR's turn cap never truncates
a file. ASR partials are whole hypotheses that may still change (Whisper re-decodes),
while SSE deltas can only append: a delta goes out only where the transcript extends
what was already sent, and ``transcript.text.done`` always carries the final text.
The ASR protocol has no word timing, so verbose_json/srt/vtt hold one segment spanning
the whole file.

Where a streaming speech-to-text engine is configured (``stt_engine.weights``: the Kyutai
engine behind ``/api/asr-streaming``, the one the cascade hears with under ``cascade.asr:
stt_engine``), it transcribes instead (docs/engines.md#cascade-streaming-asr): the file goes
to one of its streams (``kyutai_stt.clips``: the whole file in one stream, taking at most about
as long as it lasts) and each word extends the transcript (one ``transcript.text.delta`` per
word); ``language`` and ``prompt`` do not apply.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import IO, Any, Literal

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from rtserve.codecs.errors import AudioLimitError, CodecError
from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_stt.clips import heard
from rtserve.engines.kyutai_stt.service import SpeechStreamEngine
from rtserve.engines.protocols import ASREngine
from rtserve.engines.values import Pcm
from rtserve.errors import (
    AUDIO_TOO_LONG,
    EMPTY_AUDIO,
    INVALID_AUDIO,
    INVALID_CONTENT_TYPE,
    INVALID_MULTIPART,
    MISSING_PARAMETER,
)
from rtserve.web.asr_streaming.routes import ASR_STREAMING
from rtserve.web.context import CTX
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.audio import decode_audio
from rtserve.web.http.common import (
    SseStream,
    body_deadline,
    body_too_large,
    engine_errors,
    first_item,
    generation_route,
    reject_oversized,
    require_asr,
    run_generation,
    validate,
)

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 4096
SPLIT_SEARCH_FRACTION = 1 / 6  # a window is cut at its quietest 100 ms within this last part


class TranscriptionForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    language: str | None = Field(None, min_length=2, max_length=16)
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    stream: bool = False
    temperature: float = Field(0.0, ge=0, le=1)


@generation_route
async def create_transcription(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    upload, form = await _read_form(request)
    request_id = f"transcription-{uuid.uuid4().hex}"
    stt = request.app[ASR_STREAMING].engine if ctx.config.stt_engine.weights else None
    if stt is not None:
        work = functools.partial(_transcribe_streaming, request, stt, upload, form, request_id)
        return await run_generation(request, request_id, work)
    asr = require_asr(ctx, form.model)
    return await run_generation(request, request_id, functools.partial(_transcribe, request, asr, upload, form))


async def _read_form(request: web.Request) -> tuple[IO[bytes], TranscriptionForm]:
    limit = request.app[CTX].config.transport.max_http_body_bytes
    reject_oversized(request, limit)
    if request.content_type != "multipart/form-data":
        raise ApiError(
            "Send the audio as multipart/form-data with a 'file' field.", param="file", code=INVALID_CONTENT_TYPE
        )
    try:
        async with body_deadline(request, limit):
            fields = await request.post()  # bounded by the app's client_max_size (= limit)
    except web.HTTPRequestEntityTooLarge:
        raise body_too_large(limit) from None
    except ValueError:
        raise ApiError("The multipart body could not be parsed.", code=INVALID_MULTIPART) from None
    upload = fields.get("file")
    if not isinstance(upload, web.FileField):
        raise ApiError(
            "Missing required parameter: 'file' (an audio file upload).",
            param="file",
            code=MISSING_PARAMETER,
        )
    # Repeated plain fields (``timestamp_granularities[]``) are not used; the last value of the rest wins.
    values: dict[str, Any] = {k: v for k, v in fields.items() if isinstance(v, str) and not k.endswith("[]")}
    return upload.file, validate(TranscriptionForm, values)


async def _transcribe(
    request: web.Request, asr: ASREngine, upload: IO[bytes], form: TranscriptionForm
) -> web.StreamResponse:
    ctx = request.app[CTX]
    audio = await _decode(request, upload, asr.sample_rate)
    duration_s = audio.size / asr.sample_rate
    windows = split_windows(audio, int(ctx.config.http.transcription_window_s * asr.sample_rate), asr.sample_rate // 10)
    async with contextlib.aclosing(_transcripts(asr, windows, form)) as transcripts:
        if form.stream:
            return await _stream(request, transcripts)
        return _respond(await _last(transcripts), form, duration_s)


async def _transcribe_streaming(
    request: web.Request, stt: SpeechStreamEngine, upload: IO[bytes], form: TranscriptionForm, stream_id: str
) -> web.StreamResponse:
    audio = await _decode(request, upload, stt.sample_rate)
    async with contextlib.aclosing(heard(stt, audio, stream_id)) as transcripts:
        if form.stream:
            return await _stream(request, transcripts)
        return _respond(await _last(transcripts), form, audio.size / stt.sample_rate)


async def _decode(request: web.Request, upload: IO[bytes], sample_rate: int) -> FloatArray:
    """The upload as mono float samples at ``sample_rate``; a typed 4xx for what cannot be transcribed."""
    ctx = request.app[CTX]
    max_s = ctx.config.http.max_transcription_audio_s
    try:
        audio = await ctx.codecs.run(decode_audio, upload, sample_rate, max_s)
    except AudioLimitError as exc:
        raise ApiError(f"Invalid file: {exc}.", status=413, param="file", code=AUDIO_TOO_LONG) from None
    except CodecError as exc:
        raise ApiError(
            f"Invalid file: {exc}. Upload audio in a common format (wav, mp3, ogg, flac, m4a, webm, ...).",
            param="file",
            code=INVALID_AUDIO,
        ) from None
    if audio.size == 0:
        raise ApiError("Invalid file: it decodes to no audio samples.", status=422, param="file", code=EMPTY_AUDIO)
    return audio


def split_windows(audio: FloatArray, window: int, frame: int) -> list[FloatArray]:
    """Consecutive pieces of at most ``window`` samples, each cut at the lowest-energy
    ``frame`` near its end so that no word is split between two engine calls."""
    pieces = []
    search = max(frame, int(window * SPLIT_SEARCH_FRACTION) // frame * frame)
    start = 0
    while audio.size - start > window:
        low = start + window - search
        energy = np.square(audio[low : low + search]).reshape(-1, frame).sum(axis=1)
        cut = low + int(np.argmin(energy)) * frame + frame // 2
        pieces.append(audio[start:cut])
        start = cut
    pieces.append(audio[start:])
    return pieces


async def _transcripts(asr: ASREngine, windows: list[FloatArray], form: TranscriptionForm) -> AsyncGenerator[str, None]:
    """The whole transcript so far, each time it grows: finished windows plus the current one."""
    finished = ""
    for window in windows:
        text = ""
        async with contextlib.aclosing(
            asr.transcribe(_single(window), language=form.language, prompt=form.prompt)
        ) as pieces:
            async for piece in pieces:
                text = piece.text.strip()
                if text:
                    yield f"{finished} {text}".strip()
                if piece.final:
                    break
        finished = f"{finished} {text}".strip()


async def _single(window: FloatArray) -> AsyncIterator[Pcm]:
    yield window


async def _last(transcripts: AsyncIterator[str]) -> str:
    text = ""
    with engine_errors():
        async for piece in transcripts:
            text = piece
    return text


def _respond(text: str, form: TranscriptionForm, duration_s: float) -> web.Response:
    duration = round(duration_s, 3)
    usage = {"type": "duration", "seconds": duration}
    cue = (_timestamp(0.0), _timestamp(duration_s))
    match form.response_format:
        case "json":
            return web.json_response({"text": text, "usage": usage})
        case "text":
            return web.Response(text=text + "\n", content_type="text/plain")
        case "verbose_json":
            segments = [{"id": 0, "start": 0.0, "end": duration, "text": text}] if text else []
            return web.json_response(
                {
                    "task": "transcribe",
                    "language": form.language or "unknown",
                    "duration": duration,
                    "text": text,
                    "segments": segments,
                    "usage": usage,
                }
            )
        case "srt":
            body = f"1\n{cue[0].replace('.', ',')} --> {cue[1].replace('.', ',')}\n{text}\n" if text else ""
            return web.Response(text=body, content_type="application/x-subrip")
        case "vtt":
            body = f"{cue[0]} --> {cue[1]}\n{text}\n" if text else ""
            return web.Response(text="WEBVTT\n\n" + body, content_type="text/vtt")


def _timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm`` (WebVTT; SubRip uses a comma)."""
    hours, ms = divmod(round(seconds * 1000), 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{ms:03d}"


async def _stream(request: web.Request, transcripts: AsyncIterator[str]) -> web.StreamResponse:
    text = await first_item(transcripts) or ""
    sse = SseStream(request)
    await sse.start()
    sent = ""
    try:
        while True:
            if text.startswith(sent) and len(text) > len(sent):
                await sse.send({"type": "transcript.text.delta", "delta": text[len(sent) :]})
                sent = text
            following = await anext(transcripts, None)
            if following is None:
                break
            text = following
    except EngineError as exc:
        log.warning("transcription failed mid-stream: %s", exc)
        await sse.send({"type": "error", **api_error(exc).body()})
        return await sse.finish()
    await sse.send({"type": "transcript.text.done", "text": text})
    return await sse.finish()


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", create_transcription)
