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
  ``wav``, ``mp3``, ``flac``, ``opus``, ``aac``, ``pcm16`` (24 kHz). Streamed requests with
  audio output are refused (``audio_stream_unsupported``): the reply is spoken whole.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from rtserve.codecs.resample import StreamResampler
from rtserve.engines.protocols import ASREngine, ChatMessage, Pcm, TTSEngine
from rtserve.web.context import AppContext
from rtserve.web.errors import ApiError
from rtserve.web.http.audio import (SPEECH_SAMPLE_RATE, AudioDecodeError, AudioTooLong, SpeechFormat, decode_audio,
                                    open_speech_encoder)
from rtserve.web.http.common import engine_errors, require_asr, require_tts
from rtserve.web.http.transcriptions import split_windows

AUDIO_TTL_S = 3600  # ``expires_at``: how long OpenAI keeps an audio reply referable (one hour)
ChatAudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"]
_SPEECH_FORMAT: dict[str, SpeechFormat] = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "opus", "aac": "aac",
                                           "pcm16": "pcm"}


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
        raise ApiError("Invalid value for 'audio': it is required when 'modalities' includes 'audio'.",
                       param="audio", code="invalid_value")
    return audio if spoken else None


async def resolve_content(ctx: AppContext, role: str, parts: Sequence[Any], index: int) -> str:
    """A message's content parts -> its text, audio parts replaced by their transcripts."""
    texts = []
    for part in parts:
        if isinstance(part, InputAudioPart):
            if role != "user":
                raise ApiError("Invalid value for 'messages': input_audio parts belong in user messages.",
                               param=f"messages[{index}].content", code="invalid_value")
            texts.append(await _transcribe(ctx, part.input_audio, f"messages[{index}].content"))
        else:
            texts.append(part.text)
    return " ".join(t.strip() for t in texts if t.strip())


async def _transcribe(ctx: AppContext, clip: InputAudio, param: str) -> str:
    asr: ASREngine = require_asr(ctx, None)
    try:
        raw = base64.b64decode(clip.data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError("Invalid value for 'input_audio.data': it is not valid base64.", param=param,
                       code="invalid_base64") from None
    max_s = ctx.config.http.max_transcription_audio_s
    try:
        audio = await ctx.codecs.run(decode_audio, io.BytesIO(raw), asr.sample_rate, max_s)
    except AudioDecodeError as exc:
        raise ApiError(f"Invalid 'input_audio': {exc}.", param=param, code="invalid_audio") from None
    except AudioTooLong as exc:
        raise ApiError(f"Invalid 'input_audio': {exc}.", status=413, param=param, code="audio_too_long") from None
    windows = split_windows(audio, int(ctx.config.http.transcription_window_s * asr.sample_rate),
                            asr.sample_rate // 10)
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
    return {"role": "assistant", "content": None, "refusal": None,
            "audio": {"id": f"audio_{uuid.uuid4().hex}", "data": base64.b64encode(bytes(encoded)).decode("ascii"),
                      "expires_at": int(time.time()) + AUDIO_TTL_S, "transcript": text}}


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
