"""``conversation.item.create`` with ``input_audio`` content parts (OpenAI Realtime).

OpenAI accepts a user message whose content is audio (base64, the session's input audio
format) and lets the model hear it. rtserve's models read text, so the audio is
transcribed once, here, by the server's speech recognizer (the same one
``/v1/audio/transcriptions`` uses), and the message enters the conversation as an audio
item carrying that transcript. A part that brings its own ``transcript`` is taken as is.
The audio is bounded by the WebSocket frame limit (``transport.max_ws_message_bytes``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rtserve.codecs.errors import CodecError
from rtserve.codecs.pcm import b64_decode
from rtserve.codecs.resample import resample
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import ASREngine
from rtserve.engines.values import Pcm
from rtserve.errors import INVALID_VALUE
from rtserve.sessions import commands as cmd
from rtserve.sessions.session_config import AudioFormat
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.error_mapping import realtime_error
from rtserve.web.realtime.audio import decode_samples, default_rate
from rtserve.web.realtime.errors import WireError


@dataclass(frozen=True, slots=True)
class ItemPart:
    text: str | None = None  # a text part, or an audio part's own transcript
    audio: str | None = None  # base64 audio still to transcribe


@dataclass(frozen=True, slots=True)
class CreateAudioItem:
    """A message with at least one ``input_audio`` part; the connection transcribes it."""

    role: Literal["user", "assistant", "system"]
    parts: tuple[ItemPart, ...]
    previous_item_id: str | None = None
    item_id: str | None = None
    event_id: str | None = None


async def resolve_audio_item(
    action: CreateAudioItem, asr: ASREngine | None, audio_format: AudioFormat, codecs: CodecExecutor
) -> cmd.ConversationItemCreate:
    """The item with every audio part replaced by its transcript; raises ``WireError``."""
    texts = []
    for part in action.parts:
        if part.audio is None:
            texts.append(part.text or "")
            continue
        if asr is None:
            raise WireError(
                INVALID_VALUE,
                "input_audio content needs a speech recognizer and this server has none; send input_text",
                param="item.content",
                event_id=action.event_id,
            )
        try:
            pcm = await codecs.run(_decode, part.audio, audio_format, asr.sample_rate)
            texts.append(await _transcribe(asr, pcm))
        except (CodecError, EngineError) as exc:
            raise realtime_error(exc, event_id=action.event_id) from None
    return cmd.ConversationItemCreate(
        role=action.role,
        text=" ".join(t.strip() for t in texts if t.strip()),
        audio=True,
        previous_item_id=action.previous_item_id,
        item_id=action.item_id,
        event_id=action.event_id,
    )


def _decode(payload: str, audio_format: AudioFormat, rate: int) -> Pcm:
    samples = decode_samples(b64_decode(payload), audio_format)
    return resample(samples, default_rate(audio_format), rate)


async def _transcribe(asr: ASREngine, pcm: Pcm) -> str:
    async def one_chunk() -> AsyncIterator[Pcm]:
        yield pcm.astype(np.float32, copy=False)

    final = ""
    async for piece in asr.transcribe(one_chunk()):
        if piece.final:
            final = piece.text
    return final
