"""The reply chain LLM -> sentences -> TTS, built on the generic stage ``Pipeline``.

One run per response. Every stage is its own task joined by bounded queues, so the LLM
keeps generating while the TTS speaks the previous sentence, and a slow consumer stalls
the whole chain instead of buffering. Token deltas travel through every stage (the
session turns them into ``OutputText`` as they come); the last stage adds the audio of
each sentence, cut into ``chunk_samples`` pieces, the first piece carrying the sentence's
text. The reply's first spoken piece is its first clause (``first_clause_min_chars``), so
its audio starts while the LLM is still writing the first sentence. Closing the run cancels
every stage, which closes the LLM stream (the decode thread drops the request) and drops TTS
jobs not yet started. ``speak`` runs given text through the same sentence and TTS stages,
with no LLM (``response.speak``). Speaking on a streaming TTS engine (``speak_with``,
``cascade.tts: tts_engine``) one stage replaces the sentences and the TTS: every token delta
goes to the engine as it comes (``streamed_speech``).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.sentences import SentenceSplitter, speakable
from rtserve.engines.cascade.streamed_speech import speak_streamed
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.kyutai_tts.service import SpeechStreams
from rtserve.engines.pipeline import Pipeline, Stage
from rtserve.engines.protocols import LLMEngine
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta

# Streamed speech: chunks made and not yet taken by the session (the engine row waits beyond).
_STREAMED_QUEUE = 8


@dataclass(frozen=True)
class ReplyRequest:
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    voice: str | None = None
    route: str = ""  # labels the LLM's stage metrics
    spoken: bool = True  # its run leads with the voice marker (the text-only pipeline has no TTS stage to take it)


@dataclass(frozen=True)
class _Voice:
    """Leads a spoken run through the stages: the voice the TTS stage speaks it with (a streaming
    engine opens its stream on it, before the first token)."""

    name: str | None


@dataclass(frozen=True)
class _Sentence:
    text: str


@dataclass(frozen=True)
class SpokenChunk:
    pcm: FloatArray  # TextToSpeech.sample_rate
    text: str | None  # the sentence, on its first chunk (with a leading space after the first)


class ReplyChain:
    def __init__(
        self,
        llm: LLMEngine,
        tts: TextToSpeech | None,
        registry: CollectorRegistry,
        metrics: CascadeMetrics,
        *,
        chunk_samples: int,
        first_piece_max_chars: int,
        first_clause_min_chars: int,
        sentence_queue: int = 8,
    ) -> None:
        self._llm = llm
        self._tts = tts
        self._chunk = chunk_samples
        self._metrics = metrics
        self._streams: SpeechStreams | None = None
        # The first piece alone delays the first audio: on a CPU decoding ~10-15 tokens/s a
        # 240-character opening sentence would hold it ~5 s, so it is a clause, and bounded.
        self._first_max_chars = first_piece_max_chars
        self._first_clause_chars = first_clause_min_chars or None
        llm_stage = Stage("llm", self._generate, queue_size=1)
        sentences = Stage("sentences", self._sentences, queue_size=64)  # token deltas
        speech = Stage("tts", self._speak, queue_size=sentence_queue)
        self._spoken = Pipeline("cascade_reply", [llm_stage, sentences, speech], registry)
        self._text_only = Pipeline("cascade_reply_text", [llm_stage], registry)
        # ``response.speak``: given text instead of the LLM's, through the same sentences and TTS.
        self._given = Pipeline(
            "cascade_speak", [Stage("text", self._given_text, queue_size=1), sentences, speech], registry
        )

    def run(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        *,
        speak: bool,
        voice: str | None = None,
        route: str = "",
    ) -> AsyncGenerator[TokenDelta | SpokenChunk, None]:
        pipeline = self._spoken if speak else self._text_only
        return pipeline.run(_once(ReplyRequest(tuple(messages), params, voice, route, spoken=speak)))

    def speak(self, text: str, *, voice: str | None = None) -> AsyncGenerator[TokenDelta | SpokenChunk, None]:
        """Say ``text`` as is: one token delta carrying it (then its audio, sentence by sentence)."""
        return self._given.run(_once(ReplyRequest((ChatMessage("assistant", text),), SamplingParams(), voice)))

    @staticmethod
    async def _given_text(requests: AsyncIterator[ReplyRequest]) -> AsyncIterator[TokenDelta | _Voice]:
        async for request in requests:
            yield _Voice(request.voice)
            yield TokenDelta(request.messages[-1].content, finish_reason="stop")

    async def _generate(self, requests: AsyncIterator[ReplyRequest]) -> AsyncIterator[TokenDelta | _Voice]:
        async for request in requests:
            if request.spoken:
                yield _Voice(request.voice)
            started = time.perf_counter()
            first_at = 0.0
            async for delta in self._llm.generate(request.messages, request.params, fit_history=True):
                # The first token is the first delta with text or a call: a vLLM's deltas carry no
                # running count (its total comes with the last), an embedded engine's do.
                now = time.perf_counter()
                if delta.finish_reason is not None and delta.completion_tokens > 1 and first_at:
                    rate = (delta.completion_tokens - 1) / max(now - first_at, 1e-6)
                    self._metrics.llm_tokens_per_second.labels(request.route).observe(rate)
                if not first_at and (delta.text or delta.tool_call is not None):
                    first_at = now
                    self._metrics.turn_seconds.labels(request.route, "llm_first_token").observe(first_at - started)
                yield delta

    async def _sentences(
        self, deltas: AsyncIterator[TokenDelta | _Voice]
    ) -> AsyncIterator[TokenDelta | _Voice | _Sentence]:
        splitter = SentenceSplitter(first_max_chars=self._first_max_chars, first_clause_chars=self._first_clause_chars)
        async for delta in deltas:
            yield delta
            if isinstance(delta, _Voice):
                continue
            for sentence in splitter.feed(delta.text):
                yield _Sentence(sentence)
        if tail := splitter.flush():
            yield _Sentence(tail)

    async def _speak(
        self, items: AsyncIterator[TokenDelta | _Voice | _Sentence]
    ) -> AsyncIterator[TokenDelta | SpokenChunk]:
        spoke = False
        voice: str | None = None
        async for item in items:
            if isinstance(item, _Voice):
                voice = item.name
                continue
            if not isinstance(item, _Sentence):
                yield item
                continue
            spoken = speakable(item.text)
            if not spoken:
                continue
            assert self._tts is not None  # without Piper the chain speaks with streams (``speak_with``)
            pcm = await self._tts.render(spoken, voice=voice, urgent=not spoke)
            text = f" {spoken}" if spoke else spoken
            spoke = True
            for start in range(0, len(pcm), self._chunk):
                yield SpokenChunk(pcm[start : start + self._chunk], text if start == 0 else None)

    def speak_with(self, streams: SpeechStreams, registry: CollectorRegistry) -> None:
        """Speak every reply on ``streams`` from now on, token by token (built before any session)."""
        self._streams = streams
        self._stream_ids = itertools.count()
        speech = Stage("tts", self._speak_streamed, queue_size=1)
        self._spoken = Pipeline("cascade_reply", [self._spoken.stages[0], speech], registry)
        self._given = Pipeline("cascade_speak", [self._given.stages[0], speech], registry)

    def check_request(self, voice: str | None) -> None:
        """Piper judges a reply's voice before it starts; a streaming engine when its stream opens."""
        if self._streams is None:
            assert self._tts is not None
            self._tts.check_request(voice, 1.0)

    async def _speak_streamed(
        self, items: AsyncIterator[TokenDelta | _Voice]
    ) -> AsyncIterator[TokenDelta | SpokenChunk]:
        assert self._streams is not None
        marker = await anext(items, None)  # a spoken run's first item, before the LLM's first token
        if marker is None:
            return
        assert isinstance(marker, _Voice), "a spoken run leads with its voice"

        async def deltas() -> AsyncIterator[TokenDelta]:
            async for item in items:
                assert isinstance(item, TokenDelta)
                yield item

        spoken = speak_streamed(
            self._streams,
            deltas(),
            marker.name,
            stream_id=f"cascade-reply-{next(self._stream_ids)}",
            chunk_samples=self._chunk,
            max_queued=_STREAMED_QUEUE,
        )
        async with contextlib.aclosing(spoken):
            async for item in spoken:
                yield item if isinstance(item, TokenDelta) else SpokenChunk(*item)


async def _once(item: ReplyRequest) -> AsyncIterator[ReplyRequest]:
    yield item
