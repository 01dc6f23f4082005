"""The cascade hearing with a streaming speech-to-text engine (``cascade.asr: stt_engine``;
docs/engines.md#cascade-streaming-asr).

Whisper re-decodes a turn's audio for every partial and again for the final; a streaming STT
(the Kyutai engine, ``SttStream`` on its lockstep scheduler) hears the session's audio once, as
it comes, and says each word when it is out. One ``StreamAsr`` per session holds one stream
for the session's whole life:

* every input sample goes to the stream (at the session's rate, which the cascade makes the
  engine's; resampled where they differ), whether or not the VAD calls it speech, so the
  model's context is the conversation's;
* each ``Word`` is reported at once as a partial ``InputTranscript`` that *extends* the ones
  before it (``" word"``), so the deltas of a turn add up to its final transcript;
* each ``Step`` keeps the latest end-of-turn probability (the first extra head), which
  ``semantic_vad`` reads to end a pause's turn at once;
* ``finish_turn`` places a marker on the stream and returns the turn's words once the marker
  comes back, that is once every sample sent before it went through the model and its delay:
  the words the stream said since the previous turn ended (or ``clear`` dropped them). A turn
  the VAD ended after some silence places its marker where the speech ended (plus a margin for
  the last word's end), not where the audio sent so far ends: the model heard that silence
  while the VAD waited it out, so the words are out about when the turn ends instead of the
  model's delay later. A turn that ends with no such silence (a manual commit, ``semantic_vad``)
  flushes the stream: the delay is stepped at once on inserted silence, in the STT ticks' spare
  time (``SttStream.flush``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable

from rtserve.codecs.pcm import FloatArray
from rtserve.codecs.resample import StreamResampler
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineEvent, EngineFailure, InputTranscript
from rtserve.engines.kyutai_stt.events import Marker, Step, Word
from rtserve.engines.kyutai_stt.service import SpeechStream

log = logging.getLogger(__name__)

# A word is complete once the model says the padding after it, a frame or two after the word
# ends: a turn's marker stays this far past the end of its speech.
WORD_END_MARGIN_S = 0.16


class StreamAsr:
    def __init__(
        self,
        stream: SpeechStream,
        input_rate: int,
        stream_rate: int,
        release_timeout_s: float,
        report: Callable[[EngineEvent], None],
    ) -> None:
        """``report``: where partial transcripts and a failure of the stream go (the session's channel)."""
        self._stream = stream
        self._resampler = StreamResampler(input_rate, stream_rate)
        self._stream_rate = stream_rate
        self._pushed = 0  # samples the stream was given
        self._release_timeout_s = release_timeout_s
        self._report = report
        self._words: list[str] = []  # the current turn's words so far
        self._markers = itertools.count(1)
        self._waiting: deque[tuple[int, asyncio.Future[str]]] = deque()
        self.end_of_turn = 0.0  # the latest step's end-of-turn probability
        self._reader = asyncio.create_task(self._read(), name="cascade-stream-asr")

    def push(self, audio: FloatArray) -> None:
        """Session input (the session's rate), in order."""
        resampled = self._resampler.process(audio)
        if resampled.size:
            self._stream.push_audio(resampled)
            self._pushed += resampled.size

    def finish_turn(self, trailing_silence_s: float = 0.0) -> asyncio.Future[str]:
        """The words of the turn that ends ``trailing_silence_s`` before the end of the audio pushed
        so far, once the model has heard it (and ``WORD_END_MARGIN_S`` past it). The marker goes
        on the stream now, where the audio pushed so far places it."""
        marker = next(self._markers)
        heard: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append((marker, heard))
        behind = round(max(0.0, trailing_silence_s - WORD_END_MARGIN_S) * self._stream_rate)
        self._stream.mark(marker, self._pushed - behind if behind else None)
        if not behind:
            # No silence waited out before the turn ended (a manual commit, semantic_vad, a short
            # pause): the model's delay is stepped now on inserted silence, not waited in real time.
            self._stream.flush()
        return heard

    def clear(self) -> None:
        """The current turn's audio was dropped (``clear_input``, a new turn detection): so are its words."""
        self._words = []

    async def _read(self) -> None:
        try:
            async for event in self._stream.events():
                if isinstance(event, Word):
                    self._report(InputTranscript(event.text if not self._words else f" {event.text}", False))
                    self._words.append(event.text)
                elif isinstance(event, Step):
                    self.end_of_turn = event.prs[0] if event.prs else 0.0
                elif isinstance(event, Marker):
                    self._answer(event.id)
        except EngineError as exc:
            log.warning("the speech-to-text stream failed: %s", exc)
            self._report(EngineFailure(exc.code, f"speech recognition failed: {exc}"))
            for _, heard in self._waiting:
                if not heard.done():
                    heard.set_exception(exc)
            self._waiting.clear()
        finally:
            for _, heard in self._waiting:  # closed
                heard.cancel()

    def _answer(self, marker: int) -> None:
        text, self._words = " ".join(self._words), []
        while self._waiting and self._waiting[0][0] <= marker:
            done, heard = self._waiting.popleft()
            if done == marker and not heard.done():  # a turn cleared or closed meanwhile cancelled its wait
                heard.set_result(text)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._stream.close(self._release_timeout_s)
