"""Speech to text: Whisper (tiny.en by default) through faster-whisper, int8 on CPU.

Whisper is not a streaming model, so partial transcripts come from re-decoding the
growing utterance at a bounded cadence (``config.cascade.asr_partial_interval_ms``), and
only while a model lane is otherwise idle: partials are optional and never delay a
final, which also runs at a higher priority. ``lanes`` decodes run at once on the one
model (CTranslate2 keeps a worker per lane), so one session's final never waits for
another's when a core is free (``cascade.asr_lanes``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.cascade.audio import AudioBuffer, as_pcm
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.first_audio import FirstAudioWork
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ModelLocation
from rtserve.engines.cascade.whisper_window import decode_in_window, fits
from rtserve.engines.cascade.worker import PRIORITY_HIGH, PRIORITY_LOW, ModelWorker
from rtserve.engines.errors import EngineError
from rtserve.engines.values import Pcm, TranscriptPiece
from rtserve.errors import UNSUPPORTED_LANGUAGE

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
_MIN_SAMPLES = SAMPLE_RATE // 10  # shorter than 100 ms: nothing Whisper can read


class WhisperAsr:
    """The ``ASREngine``; several sessions share its one model copy and its lanes."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        location: ModelLocation,
        *,
        cpu_threads: int,
        max_queue: int,
        partial_interval_ms: int,
        max_audio_s: float,
        window_s: float,
        metrics: CascadeMetrics,
        lanes: int = 1,
        first_audio: FirstAudioWork | None = None,
    ) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._cpu_threads = cpu_threads
        self._partial_every = SAMPLE_RATE * partial_interval_ms // 1000
        self._max_samples = int(SAMPLE_RATE * max_audio_s)
        self._window_s = window_s  # ``whisper_window``: short utterances skip most of the 30 s encoder window
        self._metrics = metrics
        self._lanes = lanes
        self._worker = ModelWorker("asr", max_queue, lanes, first_audio)
        self._model = None  # faster_whisper.WhisperModel, touched only on the worker thread
        self._multilingual = False
        self._asleep = False

    @property
    def ready(self) -> bool:
        return self._model is not None

    @property
    def partial_interval_samples(self) -> int:
        return self._partial_every

    @property
    def idle(self) -> bool:
        return self._worker.idle

    async def start(self) -> None:
        self._worker.start()
        await self._worker.run(self._load)

    def _load(self) -> None:
        from faster_whisper import WhisperModel

        logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # it logs every decode at INFO
        model = WhisperModel(
            str(self._path),
            device="cpu",
            compute_type="int8",
            cpu_threads=self._cpu_threads,
            num_workers=self._lanes,  # one CTranslate2 replica per lane: decodes run in parallel
            local_files_only=True,
        )
        self._multilingual = bool(model.model.is_multilingual)
        self._model = model
        log.info("ASR %s loaded from %s", self.model_name, self._path)

    def stop(self) -> None:
        self._worker.stop()

    # Sleep mode (``SleepStage``): the model object is dropped on its own thread.
    stage = "asr"

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def release(self) -> None:
        self._asleep = True
        await self._worker.run(self._unload)

    def _unload(self) -> None:
        self._model = None

    async def restore(self) -> None:
        await self._worker.run(self._load)
        self._asleep = False

    def _not_loaded(self) -> EngineError:
        return EngineSleeping() if self._asleep else ModelNotReady("the speech model is still loading")

    def check_language(self, language: str | None) -> None:
        if language not in (None, "en") and not self._multilingual:
            raise EngineError(
                f"the speech model {self.model_name} is English-only; language {language!r} is not supported",
                code=UNSUPPORTED_LANGUAGE,
            )

    async def decode(
        self,
        audio: FloatArray,
        *,
        final: bool,
        language: str | None = None,
        prompt: str | None = None,
        live_turn: bool = False,
    ) -> str:
        """Transcribe one utterance (16 kHz float32); finals run before waiting partials.
        ``live_turn``: a voice session waits on it, so a short utterance is read in the short
        window (``cascade.asr_window_s``), trading some accuracy for time; transcription
        requests keep Whisper's full window."""
        if self._model is None:
            raise self._not_loaded()
        self.check_language(language)
        if len(audio) < _MIN_SAMPLES:
            return ""
        priority = PRIORITY_HIGH if final else PRIORITY_LOW
        return await self._worker.run(self._decode, audio, final, language, prompt, live_turn, priority=priority)

    def _decode(self, audio: FloatArray, final: bool, language: str | None, prompt: str | None, live_turn: bool) -> str:
        started = time.perf_counter()
        model = self._model  # once: sleep mode may drop it on another lane meanwhile
        if model is None:  # unloaded by sleep mode while this job waited
            raise self._not_loaded()
        text = None
        window = "full"
        if live_turn and fits(len(audio), SAMPLE_RATE, self._window_s):
            text = decode_in_window(model, audio, self._window_s, language or "en", prompt)
            window = "short" if text is not None else "redone"
        self._metrics.asr_windows.labels(window).inc()
        if text is None:
            segments, _ = model.transcribe(
                audio,
                language=language or "en",
                beam_size=1,
                temperature=0.0,
                condition_on_previous_text=False,
                without_timestamps=True,
                vad_filter=False,
                initial_prompt=prompt or None,
            )
            text = "".join(segment.text for segment in segments).strip()
        stage = "asr_final" if final else "asr_partial"
        self._metrics.model_call_seconds.labels(stage).observe(time.perf_counter() - started)
        return text

    async def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncGenerator[TranscriptPiece, None]:
        """Partials while audio arrives (when the model has time), then one final piece."""
        if self._model is None:
            raise self._not_loaded()
        self.check_language(language)
        buffer = AudioBuffer(self._max_samples)
        decoded_at = 0
        last_partial = ""
        async for chunk in audio:
            buffer.append(as_pcm(chunk))
            if len(buffer) - decoded_at >= self._partial_every and self._worker.idle:
                decoded_at = len(buffer)
                text = await self.decode(buffer.audio(), final=False, language=language, prompt=prompt)
                if text and text != last_partial:
                    last_partial = text
                    yield TranscriptPiece(text, final=False)
        if buffer.dropped_samples:
            log.warning("transcription kept only the last %.0f s of audio", self._max_samples / SAMPLE_RATE)
        yield TranscriptPiece(
            await self.decode(buffer.audio(), final=True, language=language, prompt=prompt), final=True
        )
