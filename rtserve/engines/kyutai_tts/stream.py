"""One client's text-to-speech stream on the Kyutai TTS engine: text in, audio frames and word
timings out (docs/engines.md#kyutai-tts-on-the-lockstep-runtime). Loop side only.

Text is split into words as it arrives (``ScriptSplitter``) and held here, bounded by
``max_pending_words`` unspoken words; the engine row holds at most its own ``max_words`` of them
at a time, fed as the model starts speaking the ones before (the running totals of each output
say how many), so a client may send a whole reply at LLM speed.

Word timings follow moshi-server: when a word starts, the word before it is reported with
``start_s`` = the step it started at / frame rate and ``stop_s`` = this step / frame rate; the
last word when the speech is done. Pauses (``<break time="..."/>``) take steps but are not
reported.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.kyutai_tts.script import ScriptSplitter, Word
from rtserve.engines.lockstep.lease import SlotLease
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.engines.values import SpeechStep
from rtserve.errors import ENGINE_ERROR, INPUT_BACKPRESSURE, STREAM_ALREADY_ENDED

log = logging.getLogger(__name__)


class TextRows(Protocol):
    """What a stream asks of the engine's rows (``TTSFrameModel``), on the engine thread."""

    max_words: int  # words a row holds unspoken

    def push(self, slot: int, words: list[Word]) -> None: ...

    def end(self, slot: int) -> None: ...


@dataclass(frozen=True)
class SpokenWord:
    text: str
    start_s: float
    stop_s: float


@dataclass(frozen=True)
class SpeechAudio:
    pcm: FloatArray  # one decoded frame, mono float32 at the engine's sample rate


SpeechEvent = SpokenWord | SpeechAudio


class TTSStream:
    def __init__(
        self,
        scheduler: LockstepScheduler,
        lease: SlotLease,
        model: TextRows,
        splitter: ScriptSplitter,
        *,
        frame_rate: float,
        max_pending_words: int,
        release_timeout_s: float,
        on_first_audio: Callable[[float, SpeechStep], None] | None = None,
    ) -> None:
        """``on_first_audio``: given the seconds from the first text received to the first audio
        frame handed out (the engine's share of a reply's first audio) and the row's steps then."""
        self._scheduler = scheduler
        self._lease = lease
        self._model = model
        self._splitter = splitter
        self._frame_rate = frame_rate
        self._max_pending = max_pending_words
        self._release_timeout_s = release_timeout_s
        self._waiting: deque[Word] = deque()  # split, not yet handed to the engine
        self._fed = 0  # words handed to the engine
        self._started = 0  # words the engine began to speak (as its outputs said)
        self._texts: deque[str] = deque()  # handed over and not yet reported, in order
        self._word_start: int | None = None  # the step the word being spoken started at
        self.ended = False  # the client's end of stream
        self._end_sent = False
        self._on_first_audio = on_first_audio
        self._first_text_at: float | None = None
        self._audio_sent = False

    @property
    def pending_words(self) -> int:
        """Words sent and not yet begun."""
        return len(self._waiting) + self._fed - self._started

    def send_text(self, text: str) -> None:
        if self.ended:
            raise EngineError("text after the end of stream", code=STREAM_ALREADY_ENDED)
        words = self._splitter.split(text)
        if self.pending_words + len(words) > self._max_pending:
            raise EngineError(
                f"more than {self._max_pending} words wait to be spoken; send text as it is spoken",
                code=INPUT_BACKPRESSURE,
            )
        if self._first_text_at is None and words:
            self._first_text_at = time.monotonic()
        self._waiting.extend(words)
        self._feed()

    def end(self) -> None:
        """No more text; a second end of stream is refused."""
        if self.ended:
            raise EngineError("end of stream sent twice", code=STREAM_ALREADY_ENDED)
        self.ended = True
        if not self._fed and not self._waiting:
            self._lease.release()  # nothing to say: the stream is over (its events end)
            return
        self._feed()

    def _feed(self) -> None:
        room = self._model.max_words - (self._fed - self._started)
        batch = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
        if batch:
            self._fed += len(batch)
            self._texts.extend(word.text for word in batch)
            self._scheduler.between_steps(self._lease, partial(self._model.push, self._lease.slot, batch))
        if self.ended and not self._waiting and not self._end_sent and self._fed:
            self._end_sent = True
            self._scheduler.between_steps(self._lease, partial(self._model.end, self._lease.slot))

    async def events(self) -> AsyncGenerator[SpeechEvent, None]:
        """Word timings and audio frames until the speech is done; ``EngineError`` if the engine
        ended the stream. A stream ended before any word ends at once, silent."""
        while True:
            item = await self._lease.next_output()
            if item is None:
                return
            if isinstance(item, EngineFailure):
                raise EngineError(item.message, code=item.code)
            frame, _ = item
            speech = frame.speech
            if speech is None:
                continue
            if speech.overflow:
                raise EngineError("the text could not be fed to the model", code=ENGINE_ERROR)
            for word in self._words(speech):
                yield word
            if frame.audio.size:
                if not self._audio_sent:
                    self._first_audio(speech)
                yield SpeechAudio(frame.audio)
            if speech.done:
                if self._word_start is not None and self._texts:
                    last = SpokenWord(self._texts.popleft(), self._time(self._word_start), self._time(speech.steps))
                    if last.text:
                        yield last
                return
            self._feed()

    def _first_audio(self, speech: SpeechStep) -> None:
        self._audio_sent = True
        if self._on_first_audio is not None and self._first_text_at is not None:
            self._on_first_audio(time.monotonic() - self._first_text_at, speech)

    def _words(self, speech: SpeechStep) -> list[SpokenWord]:
        """The words ``speech`` ends: each ends where the next one begins."""
        words: list[SpokenWord] = []
        begun = speech.words_started - self._started
        if begun <= 0:
            return words
        known = list(speech.word_starts[-begun:])
        # A frame dropped for a stalled reader passes its starts on (OutputHandoff); words begun in
        # one voided by an epoch fence have none: they end at the first known start.
        starts = [known[0] if known else speech.steps] * (begun - len(known)) + known
        for start in starts:
            if self._word_start is not None and self._texts:
                text = self._texts.popleft()
                if text:
                    words.append(SpokenWord(text, self._time(self._word_start), self._time(start)))
            self._word_start = start
        self._started = speech.words_started
        return words

    def _time(self, steps: int) -> float:
        return steps / self._frame_rate

    async def close(self) -> None:
        """Release the slot and wait (bounded) until the engine thread freed it, so a client that
        saw its stream end finds the slot free (idempotent)."""
        self._lease.release()
        if not await self._lease.wait_released(self._release_timeout_s):
            log.warning("kyutai tts slot %d not freed within %.1f s", self._lease.slot, self._release_timeout_s)
