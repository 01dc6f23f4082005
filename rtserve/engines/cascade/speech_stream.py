"""``/api/asr-streaming`` on the embedded Whisper: the ``SpeechStreamEngine`` served when no
Kyutai STT engine is configured (docs/serving.md#asr-streaming).

Whisper is not a streaming model, so a stream is cut into utterances by the Silero VAD
(``TurnDetector``, server_vad defaults): an utterance's audio streams to the app's
``ASREngine`` (``turn_engines.asr``) as it is spoken, it ends after 500 ms of silence, and
its words come out once the final transcript is in, each ``Word`` with its ``EndWord``.
The ASR protocol gives text without timestamps (faster-whisper's ``word_timestamps`` are
not reached through it),
so word times are estimated: the utterance's voiced span (VAD speech start to speech stop)
is shared among its words in proportion to their length.

Audio is consumed in 80 ms frames (12.5 Hz, as Kyutai's models step), each a ``Step`` whose
one ``prs`` value is ``1 - p(speech)``, the VAD's speech probability of the last 32 ms
window scored by then (near 1 in a pause, near 0 while voiced). A ``Marker`` is answered
once every sample before it was through the VAD and no utterance holding them is still
open or untranscribed: as with Kyutai's clients, trailing silence brings it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.codecs.resample import StreamResampler
from rtserve.config import ModelPaths
from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.cascade.model_paths import resolve_vad
from rtserve.engines.cascade.turn_detection import SealedTurn, TurnDetector
from rtserve.engines.cascade.vad import SAMPLE_RATE, WINDOW, SileroVad, VadStream
from rtserve.engines.errors import EngineError
from rtserve.engines.events import SpeechStarted, SpeechStopped
from rtserve.engines.kyutai_stt.events import EndWord, Marker, Step, SttEvent, Word
from rtserve.engines.lockstep.framing import check_audio
from rtserve.engines.protocols import ASREngine
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import Pcm
from rtserve.errors import ENGINE_UNAVAILABLE

log = logging.getLogger(__name__)

INPUT_RATE = 24_000
FRAME = INPUT_RATE * 80 // 1000  # one Step
_MAX_UTTERANCE_S = 30.0


@dataclass
class _PendingMarker:
    id: int
    samples: int  # samples sent before it


def timed_words(text: str, start_s: float, stop_s: float) -> list[SttEvent]:
    """``Word``/``EndWord`` pairs for ``text`` spoken over ``[start_s, stop_s]``, the span shared
    by word length."""
    words = text.split()
    total = sum(len(word) for word in words)
    events: list[SttEvent] = []
    at = start_s
    for word in words:
        end = at + (stop_s - start_s) * len(word) / total
        events += [Word(word, round(at, 3)), EndWord(round(end, 3))]
        at = end
    return events


class _Utterance:
    """One utterance streamed to the ASR engine while it is spoken (its partial decodes run
    while the model is otherwise idle, as a realtime session's do); ``end`` waits for the final."""

    def __init__(self, asr: ASREngine, start_ms: int) -> None:
        self.start_ms = start_ms
        self._audio: asyncio.Queue[FloatArray | None] = asyncio.Queue()
        self._final = asyncio.create_task(self._transcribe(asr))

    async def _chunks(self) -> AsyncIterator[Pcm]:
        while (chunk := await self._audio.get()) is not None:
            yield chunk

    async def _transcribe(self, asr: ASREngine) -> str:
        text = ""
        async for piece in asr.transcribe(self._chunks()):
            if piece.final:
                text = piece.text
        return text

    def feed(self, audio: FloatArray) -> None:
        self._audio.put_nowait(audio)

    async def end(self) -> str:
        self._audio.put_nowait(None)
        return await self._final

    async def cancel(self) -> None:
        self._final.cancel()
        await asyncio.gather(self._final, return_exceptions=True)


class WhisperSttStream:
    """One client's stream: VAD-cut utterances transcribed by the ASR engine."""

    def __init__(self, asr: ASREngine, vad: SileroVad) -> None:
        self._asr = asr
        self._vad = vad
        self._vad_state = VadStream()
        self._detector = TurnDetector(TurnDetection(), SAMPLE_RATE, WINDOW, int(SAMPLE_RATE * _MAX_UTTERANCE_S))
        self._resampler = StreamResampler(INPUT_RATE, SAMPLE_RATE)
        self._inbox: deque[FloatArray] = deque()
        self._tail = np.zeros(0, np.float32)
        self._wake = asyncio.Event()
        self._sent = 0
        self._consumed = 0  # input samples through the VAD
        self._markers: deque[_PendingMarker] = deque()
        self._step = 0
        self._speech_pr = 0.0
        self._utterance: _Utterance | None = None
        self._closed = False

    @property
    def pending_markers(self) -> int:
        return len(self._markers)

    def push_audio(self, pcm: Pcm) -> None:
        samples = check_audio(pcm)
        if self._closed or not samples.size:
            return
        self._sent += samples.size
        self._inbox.append(samples)
        self._wake.set()

    def mark(self, marker_id: int, samples: int | None = None) -> None:
        self._markers.append(_PendingMarker(marker_id, self._sent if samples is None else min(samples, self._sent)))
        self._wake.set()

    def flush(self) -> None:
        """Nothing to step: a marker waits for the utterances before it to be decoded, not for a model's delay."""

    async def events(self) -> AsyncGenerator[SttEvent, None]:
        """Events until the stream is closed; an ASR failure raises its ``EngineError``."""
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while self._inbox:
                self._tail = np.concatenate([self._tail, self._inbox.popleft()])
            while self._tail.size >= FRAME:
                frame, self._tail = self._tail[:FRAME], self._tail[FRAME:]
                for event in await self._frame(frame):
                    yield event
            for event in self._due_markers():
                yield event

    def _turn_taken(self) -> int:
        """A position in the audio the detector's utterances took (its dropped-sample count
        runs across utterances); 0 between utterances. Two readings differ by what was added."""
        return self._detector.turn_samples + self._detector.dropped_samples if self._detector.speaking else 0

    async def _frame(self, frame: FloatArray) -> list[SttEvent]:
        scores = await asyncio.to_thread(self._vad.process, self._vad_state, self._resampler.process(frame))
        self._consumed += frame.size
        if scores.scores.size:
            self._speech_pr = float(scores.scores[-1])
        self._step += 1
        events: list[SttEvent] = [Step(self._step, (1.0 - self._speech_pr,), self._sent - self._consumed)]
        taken = self._turn_taken()
        stopped_ms = 0
        for happened in self._detector.feed(scores.windows, scores.scores, scores.first_sample):
            if isinstance(happened, SpeechStarted):
                self._utterance = _Utterance(self._asr, happened.audio_ms)
            elif isinstance(happened, SpeechStopped):
                stopped_ms = happened.audio_ms
            elif isinstance(happened, SealedTurn) and self._utterance is not None:
                utterance = self._utterance  # kept on the stream until done: ``close`` cancels it
                utterance.feed(_newest(happened.audio, happened.audio.size + self._detector.dropped_samples - taken))
                text = await utterance.end()
                self._utterance = None
                events += timed_words(text, utterance.start_ms / 1000, stopped_ms / 1000)
                taken = 0
        if self._utterance is not None:
            self._utterance.feed(_newest(self._detector.turn_audio(), self._turn_taken() - taken))
        return events + self._due_markers()

    def _due_markers(self) -> list[SttEvent]:
        events: list[SttEvent] = []
        while self._markers and self._consumed >= self._markers[0].samples and not self._detector.speaking:
            events.append(Marker(self._markers.popleft().id))
        return events

    async def close(self, release_timeout_s: float) -> None:
        """Stop; an utterance still being transcribed is dropped. Idempotent."""
        self._closed = True
        self._wake.set()
        if self._utterance is not None:
            await self._utterance.cancel()
            self._utterance = None


def _newest(audio: FloatArray, count: int) -> FloatArray:
    """The last ``count`` samples of ``audio`` (all of it when shorter)."""
    return audio[max(audio.size - count, 0) :]


class WhisperSpeechStreamEngine:
    """The ``SpeechStreamEngine`` on the app's ASR engine; ``asr`` gives it once the app's
    engines serve (they start in the background), None before. The Silero VAD runs here, one
    ONNX session shared by every stream (each keeps its own state), on the default executor."""

    sample_rate = INPUT_RATE
    release_timeout_s = 1.0

    def __init__(self, paths: ModelPaths, asr: Callable[[], ASREngine | None]) -> None:
        self._paths = paths
        self._asr = asr
        self._vad: SileroVad | None = None
        self._failure: str | None = None

    async def start(self) -> None:
        try:
            location = resolve_vad(self._paths)
        except ModelUnavailable as exc:  # kept for the route's refusal
            log.warning("the VAD for /api/asr-streaming did not load: %s", exc)
            self._failure = f"the voice activity detector did not load: {exc}"
            return
        assert location.path is not None  # resolved: a file that exists
        self._vad = await asyncio.to_thread(SileroVad, location.path)

    async def stop(self) -> None:
        self._vad = None

    @property
    def ready(self) -> bool:
        return self._vad is not None and self._asr() is not None

    @property
    def failure(self) -> str | None:
        return self._failure

    async def open_stream(self, stream_id: str) -> WhisperSttStream:
        asr = self._asr()
        if self._failure is not None:
            raise EngineError(self._failure, code=ENGINE_UNAVAILABLE)
        if asr is None or self._vad is None:
            raise EngineError("the speech models are still loading", code=ENGINE_UNAVAILABLE)
        return WhisperSttStream(asr, self._vad)
