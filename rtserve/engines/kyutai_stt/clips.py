"""Whole clips through the streaming STT: a transcription request's file (``heard``), and the
engine as an ``ASREngine`` (``ClipTranscriber``) where the cascade hears with it
(``cascade.asr: stt_engine``), so a chat message's ``input_audio`` and a realtime
``conversation.item.create`` audio part are heard by the model that hears the live turns, and
no Whisper is loaded beside it (docs/engines.md#cascade-streaming-asr).

A clip goes to one stream no faster than the model steps it (the engine's backlog is bounded):
``STREAM_FEED_S`` at a time, topped up as the model catches up, then a second of silence (which
closes the last word) and a marker that ends it. The stream steps a frame a tick, plus drain
steps in the ticks' spare time once its audio has stood a while (``stt_engine.drain_waiting_input``),
so a clip takes at most about as long as it lasts; a language or prompt does not apply.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_stt.events import Marker, Step, Word
from rtserve.engines.kyutai_stt.service import SpeechStreamEngine
from rtserve.engines.values import Pcm, TranscriptPiece
from rtserve.errors import AUDIO_TOO_LONG, ENGINE_UNAVAILABLE

MODEL_NAME = "kyutai-stt"
STREAM_FEED_S = 4.0  # the stream is given this much of the clip at a time, ahead of its steps
STREAM_TAIL_S = 1.0  # silence after the clip: the model closes the last word in it


async def heard(stt: SpeechStreamEngine, audio: FloatArray, stream_id: str) -> AsyncGenerator[str, None]:
    """The whole transcript so far, each time a word of ``audio`` (at the engine's rate) is out."""
    stream = await stt.open_stream(stream_id)  # CapacityExhausted / EngineError: before any word
    try:
        audio = np.concatenate([audio, np.zeros(int(STREAM_TAIL_S * stt.sample_rate), np.float32)])
        feed = int(STREAM_FEED_S * stt.sample_rate)
        fed = 0

        def give() -> None:
            nonlocal fed
            stream.push_audio(audio[fed : fed + feed])
            fed += feed
            if fed >= audio.size:
                stream.mark(0)

        give()
        words: list[str] = []
        async for event in stream.events():
            if isinstance(event, Word):
                words.append(event.text)
                yield " ".join(words)
            elif isinstance(event, Step) and fed < audio.size and event.buffered_pcm < feed // 2:
                give()
            elif isinstance(event, Marker):
                return
        raise EngineError("the speech-to-text engine stopped", code=ENGINE_UNAVAILABLE)
    finally:
        await stream.close(stt.release_timeout_s)


class ClipTranscriber:
    """The streaming STT as the turn engines' ``ASREngine``: the clip is gathered (at most
    ``max_audio_s``), then heard on one stream; a partial piece per word, then the final one."""

    def __init__(self, stt: SpeechStreamEngine, max_audio_s: float) -> None:
        self._stt = stt
        self._max_samples = int(max_audio_s * stt.sample_rate)
        self._ids = itertools.count(1)
        self.model_name = MODEL_NAME
        self.sample_rate = stt.sample_rate

    async def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncGenerator[TranscriptPiece, None]:
        chunks: list[FloatArray] = []
        samples = 0
        async for chunk in audio:
            pcm = np.asarray(chunk, dtype=np.float32).reshape(-1)
            samples += pcm.size
            if samples > self._max_samples:
                raise EngineError(
                    f"the audio is longer than {self._max_samples / self.sample_rate:.0f} s", code=AUDIO_TOO_LONG
                )
            chunks.append(pcm)
        text = ""
        clip = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        async with contextlib.aclosing(heard(self._stt, clip, f"clip-{next(self._ids)}")) as transcripts:
            async for text in transcripts:
                yield TranscriptPiece(text, final=False)
        yield TranscriptPiece(text, final=True)
