"""Audio in and out of ``POST /v1/chat/completions``, as OpenAI's audio-capable chat models
take and return it.

* In: a user message may hold ``{"type": "input_audio", "input_audio": {"data": <base64>,
  "format": "wav" | "mp3"}}`` parts. The text engine reads text, so each clip is decoded
  (any container FFmpeg reads, bounded by ``http.max_transcription_audio_s``) and
  transcribed by the server's recognizer (the ``/v1/audio/transcriptions`` one); the
  transcript takes the part's place in the message.
* Out: ``modalities: ["text", "audio"]`` with ``audio: {"voice", "format"}`` speaks the
  reply with the server's synthesizer and returns it as OpenAI does: ``message.content``
  null and ``message.audio`` = ``{id, data (base64), expires_at, transcript}``. Formats:
  ``wav``, ``mp3``, ``flac``, ``opus``, ``aac``, ``pcm16`` (24 kHz).
* Streamed (``stream: true``; ``pcm16`` only, as OpenAI): the role chunk, then
  ``delta.audio`` chunks: ``{id, transcript}`` pieces as the model writes, ``{id, data}``
  PCM16 pieces as the synthesizer speaks each sentence, ``{expires_at}`` last; then the
  ``finish_reason`` chunk, usage when asked, ``[DONE]``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from rtserve.codecs.errors import AudioLimitError, CodecError
from rtserve.codecs.pcm import float_to_pcm16
from rtserve.codecs.resample import StreamResampler
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import ASREngine, LLMEngine, TTSEngine
from rtserve.engines.values import ChatMessage, Pcm, SamplingParams, TokenDelta
from rtserve.errors import AUDIO_TOO_LONG, INVALID_AUDIO, INVALID_BASE64, INVALID_VALUE
from rtserve.web.context import AppContext
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.audio import (
    SPEECH_SAMPLE_RATE,
    SpeechFormat,
    decode_audio,
    open_speech_encoder,
)
from rtserve.web.http.common import SseStream, engine_errors, first_item, require_asr, require_tts
from rtserve.web.http.transcriptions import split_windows

log = logging.getLogger(__name__)

AUDIO_TTL_S = 3600  # ``expires_at``: how long OpenAI keeps an audio reply referable (one hour)
ChatAudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"]
_SPEECH_FORMAT: dict[str, SpeechFormat] = {
    "wav": "wav",
    "mp3": "mp3",
    "flac": "flac",
    "opus": "opus",
    "aac": "aac",
    "pcm16": "pcm",
}


class InputAudio(BaseModel):
    model_config = ConfigDict(extra="ignore")
    data: str
    format: Literal["wav", "mp3"]


class InputAudioPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    voice: str | dict[str, str]
    format: ChatAudioFormat

    @property
    def voice_name(self) -> str | None:
        return self.voice.get("id") if isinstance(self.voice, dict) else self.voice


def wants_audio(modalities: Sequence[str] | None, audio: AudioOutput | None) -> AudioOutput | None:
    """The audio output asked for, or None; ``audio`` without the modality (or the reverse) is refused."""
    spoken = bool(modalities) and "audio" in modalities  # type: ignore[operator]
    if spoken and audio is None:
        raise ApiError(
            "Invalid value for 'audio': it is required when 'modalities' includes 'audio'.",
            param="audio",
            code=INVALID_VALUE,
        )
    return audio if spoken else None


async def resolve_content(ctx: AppContext, role: str, parts: Sequence[Any], index: int) -> str:
    """A message's content parts -> its text, audio parts replaced by their transcripts."""
    texts = []
    for part in parts:
        if isinstance(part, InputAudioPart):
            if role != "user":
                raise ApiError(
                    "Invalid value for 'messages': input_audio parts belong in user messages.",
                    param=f"messages[{index}].content",
                    code=INVALID_VALUE,
                )
            texts.append(await _transcribe(ctx, part.input_audio, f"messages[{index}].content"))
        else:
            texts.append(part.text)
    return " ".join(t.strip() for t in texts if t.strip())


async def _transcribe(ctx: AppContext, clip: InputAudio, param: str) -> str:
    asr: ASREngine = require_asr(ctx, None)
    try:
        raw = base64.b64decode(clip.data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            "Invalid value for 'input_audio.data': it is not valid base64.", param=param, code=INVALID_BASE64
        ) from None
    max_s = ctx.config.http.max_transcription_audio_s
    try:
        audio = await ctx.codecs.run(decode_audio, io.BytesIO(raw), asr.sample_rate, max_s)
    except AudioLimitError as exc:
        raise ApiError(f"Invalid 'input_audio': {exc}.", status=413, param=param, code=AUDIO_TOO_LONG) from None
    except CodecError as exc:
        raise ApiError(f"Invalid 'input_audio': {exc}.", param=param, code=INVALID_AUDIO) from None
    windows = split_windows(audio, int(ctx.config.http.transcription_window_s * asr.sample_rate), asr.sample_rate // 10)
    texts = []
    with engine_errors():
        for window in windows:
            async for piece in asr.transcribe(_single(window)):
                if piece.final:
                    texts.append(piece.text.strip())
    return " ".join(t for t in texts if t)


async def _single(window: Pcm) -> AsyncIterator[Pcm]:
    yield window


async def spoken_message(ctx: AppContext, text: str, audio: AudioOutput) -> dict[str, Any]:
    """OpenAI's assistant message of an audio reply: ``text`` spoken, as ``message.audio``."""
    tts: TTSEngine = require_tts(ctx, None)
    encoder = open_speech_encoder(_SPEECH_FORMAT[audio.format])
    resampler = StreamResampler(tts.sample_rate, SPEECH_SAMPLE_RATE)
    encoded = bytearray()
    with engine_errors():
        async with contextlib.aclosing(tts.synthesize(text, voice=audio.voice_name)) as chunks:
            async for pcm in chunks:
                samples = np.asarray(pcm, dtype=np.float32).reshape(-1)
                encoded += await ctx.codecs.run(lambda s=samples: encoder.encode(resampler.process(s)))
    encoded += await ctx.codecs.run(lambda: encoder.encode(resampler.flush()) + encoder.finish())
    return {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "audio": {
            "id": f"audio_{uuid.uuid4().hex}",
            "data": base64.b64encode(bytes(encoded)).decode("ascii"),
            "expires_at": int(time.time()) + AUDIO_TTL_S,
            "transcript": text,
        },
    }


def check_stream_format(audio: AudioOutput) -> None:
    if audio.format != "pcm16":
        raise ApiError(
            "Invalid value for 'audio.format': streamed audio output must be 'pcm16'.",
            param="audio.format",
            code=INVALID_VALUE,
        )


async def stream_spoken(
    request: web.Request,
    ctx: AppContext,
    llm: LLMEngine,
    messages: Sequence[ChatMessage],
    params: SamplingParams,
    envelope: dict[str, Any],
    audio: AudioOutput,
    include_usage: bool,
) -> web.StreamResponse:
    """``stream: true`` with audio output (see the module note)."""
    tts: TTSEngine = require_tts(ctx, None)
    audio_id = f"audio_{uuid.uuid4().hex}"
    usage_field = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            **envelope,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            **usage_field,
        }

    text: list[str] = []
    last: TokenDelta | None = None
    async with contextlib.aclosing(llm.generate(messages, params)) as deltas:
        last = await first_item(deltas)
        sse = SseStream(request)
        await sse.start()
        await sse.send(chunk({"role": "assistant", "content": None}))
        try:
            while last is not None:
                if last.text:
                    text.append(last.text)
                    await sse.send(chunk({"audio": {"id": audio_id, "transcript": last.text}}))
                if last.finish_reason is not None:
                    break
                last = await anext(deltas, None)
            resampler = StreamResampler(tts.sample_rate, SPEECH_SAMPLE_RATE)
            async with contextlib.aclosing(tts.synthesize("".join(text), voice=audio.voice_name)) as chunks:
                async for pcm in chunks:
                    samples = await ctx.codecs.run(resampler.process, np.asarray(pcm, dtype=np.float32).reshape(-1))
                    await sse.send(chunk({"audio": {"id": audio_id, "data": _pcm16_b64(samples)}}))
            tail = resampler.flush()
            if tail.size:
                await sse.send(chunk({"audio": {"id": audio_id, "data": _pcm16_b64(tail)}}))
        except EngineError as exc:
            log.warning("spoken reply failed mid-stream: %s", exc)
            await sse.send(api_error(exc).body())
            await sse.send_done_marker()
            return await sse.finish()
    await sse.send(chunk({"audio": {"expires_at": int(time.time()) + AUDIO_TTL_S}}))  # the last update: expiry only
    await sse.send(chunk({}, (last and last.finish_reason) or "stop"))
    if include_usage:
        prompt = last.prompt_tokens if last else 0
        completion = last.completion_tokens if last else 0
        await sse.send(
            {
                **envelope,
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )
    await sse.send_done_marker()
    return await sse.finish()


def _pcm16_b64(samples: Pcm) -> str:
    return base64.b64encode(float_to_pcm16(samples)).decode("ascii")


async def engine_messages(ctx: AppContext, messages: Sequence[Any]) -> list[ChatMessage]:
    """The request's messages for the text engine, audio parts transcribed (``MessageIn``s)."""
    out = []
    for index, message in enumerate(messages):
        parts = message.content
        if isinstance(parts, list) and any(isinstance(p, InputAudioPart) for p in parts):
            out.append(message.to_engine(await resolve_content(ctx, message.role, parts, index)))
        else:
            out.append(message.to_engine())
    return out
