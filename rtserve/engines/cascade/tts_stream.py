"""``WS /api/tts_streaming`` spoken by the app's turn-engine TTS (Piper) when no Kyutai TTS
engine is configured (docs/serving.md#tts-streaming).

Text is split into sentences as it arrives (``SentenceSplitter``, as ``/v1/audio/speech/stream``
does; each message is whole words, as on the Kyutai engine); each sentence is synthesized once it
is complete (the client's end of stream flushes the tail), and its audio goes out in
``FRAME``-sample pieces. Piper gives no word alignment: a sentence's words are spread over its
audio by character count, so ``start_s``/``stop_s`` are an estimate (they are in order, and
within the sentence that holds the word).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np

from rtserve.engines.cascade.sentences import SentenceSplitter, speakable
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.stream import SpeechAudio, SpeechEvent, SpokenWord
from rtserve.engines.protocols import TTSEngine
from rtserve.errors import INPUT_BACKPRESSURE, STREAM_ALREADY_ENDED, VOICE_NOT_FOUND

FRAME = 1920  # samples per Audio message: 80 ms at 24 kHz, the Kyutai engine's frame


class PiperSpeechStreams:
    """Opens streams on ``tts`` (a ``SpeechStreams``)."""

    def __init__(self, tts: TTSEngine, *, max_pending_words: int) -> None:
        self._tts = tts
        self._max_pending_words = max_pending_words

    @property
    def sample_rate(self) -> int:
        return self._tts.sample_rate

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> PiperSpeechStream:
        """A stream with ``voice`` (one of the TTS's voices; None: its default); ``stream_id`` and
        ``seed`` do not apply (Piper keeps no per-stream state and does not sample)."""
        if voice is not None:
            names = [info.name for info in await self._tts.voice_list()]
            if voice not in names:
                raise EngineError(
                    f"unknown voice {voice!r}; this server speaks with {', '.join(names)}", code=VOICE_NOT_FOUND
                )
        return PiperSpeechStream(self._tts, voice, max_pending_words=self._max_pending_words)


class PiperSpeechStream:
    def __init__(self, tts: TTSEngine, voice: str | None, *, max_pending_words: int) -> None:
        self._tts = tts
        self._voice = voice
        self._max_pending = max_pending_words
        self._splitter = SentenceSplitter()
        self._sentences: asyncio.Queue[str | None] = asyncio.Queue()  # None: the end of stream
        self._queued_words = 0  # words of the sentences split off so far
        self._spoken_words = 0
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def send_text(self, text: str) -> None:
        if self._ended:
            raise EngineError("text after the end of stream", code=STREAM_ALREADY_ENDED)
        if self._queued_words - self._spoken_words + len(text.split()) > self._max_pending:
            raise EngineError(
                f"more than {self._max_pending} words wait to be spoken; send text as it is spoken",
                code=INPUT_BACKPRESSURE,
            )
        for sentence in self._splitter.feed(f"{text} "):  # each message is whole words
            self._queue(sentence)

    def end(self) -> None:
        if self._ended:
            raise EngineError("end of stream sent twice", code=STREAM_ALREADY_ENDED)
        self._ended = True
        if (tail := self._splitter.flush()) is not None:
            self._queue(tail)
        self._sentences.put_nowait(None)

    def _queue(self, sentence: str) -> None:
        self._queued_words += len(sentence.split())
        self._sentences.put_nowait(sentence)

    async def events(self) -> AsyncGenerator[SpeechEvent, None]:
        """Each sentence's words (estimated timings) then its audio, once it is synthesized."""
        spoken_s = 0.0
        rate = self._tts.sample_rate
        while (sentence := await self._sentences.get()) is not None:
            text = speakable(sentence)
            chunks = [pcm async for pcm in self._tts.synthesize(text, voice=self._voice)] if text else []
            audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            self._spoken_words += len(sentence.split())
            duration_s = audio.size / rate
            for word in _spread(text.split(), spoken_s, duration_s):
                yield word
            for start in range(0, audio.size, FRAME):
                yield SpeechAudio(audio[start : start + FRAME])
            spoken_s += duration_s

    async def close(self) -> None:
        """Nothing is held: synthesis stops with the consumer of ``events``."""


def _spread(words: list[str], start_s: float, duration_s: float) -> list[SpokenWord]:
    """``words`` over ``duration_s`` from ``start_s``, each for a share of it by its length."""
    total = sum(len(word) for word in words)
    spoken: list[SpokenWord] = []
    done = 0
    for word in words:
        begin = start_s + duration_s * done / total
        done += len(word)
        spoken.append(SpokenWord(word, begin, start_s + duration_s * done / total))
    return spoken
