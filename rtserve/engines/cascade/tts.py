"""Text to speech: a Piper voice (the shipped ``joe`` voice by default) or espeak-ng.

Audio streams sentence by sentence: each sentence is one job on the TTS thread, so the
first sentence plays while later ones are still being synthesized, and cancelling the
consumer drops every sentence not yet started. Output is always 24 kHz mono float32
(Piper voices are 22.05 kHz; resampled with soxr on the TTS thread), which is the
OpenAI Realtime/speech wire rate, so the common transports pass it through untouched.

espeak-ng is the fallback when the GPL voice wheel (the ``voice`` extra) is absent, or
when ``models.tts`` is ``espeak-ng``; it runs as the system ``espeak-ng`` program.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import numpy as np

from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.errors import ModelNotReady, ModelUnavailable
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.codecs.pcm import WIRE_SAMPLE_RATE
from rtserve.engines.cascade.model_paths import ESPEAK, ModelLocation
from rtserve.engines.cascade.sentences import speakable, split_sentences
from rtserve.engines.cascade.worker import ModelWorker
from rtserve.engines.protocols import EngineError

log = logging.getLogger(__name__)

SAMPLE_RATE = WIRE_SAMPLE_RATE
# OpenAI's built-in voice names: clients send them by default, so each selects our voice.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                           "shimmer", "verse", "marin", "cedar"})
_ESPEAK_TIMEOUT_S = 30.0
_ESPEAK_WPM = 175


class _Backend(Protocol):
    sample_rate: int

    def render(self, sentence: str, speed: float) -> np.ndarray: ...


class _PiperBackend:
    def __init__(self, model_path: Path, cpu_threads: int) -> None:
        import onnxruntime
        from piper.config import PiperConfig
        from piper.voice import PiperVoice

        config = PiperConfig.from_dict(json.loads(Path(f"{model_path}.json").read_text(encoding="utf-8")))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = cpu_threads
        options.inter_op_num_threads = 1
        # PiperVoice.load() would use onnxruntime's default (all cores): build it with our bound.
        session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                               providers=["CPUExecutionProvider"])
        self._voice = PiperVoice(session=session, config=config)
        self.sample_rate = config.sample_rate

    def render(self, sentence: str, speed: float) -> np.ndarray:
        from piper.config import SynthesisConfig

        length_scale = self._voice.config.length_scale / speed
        chunks = [c.audio_float_array for c in self._voice.synthesize(
            sentence, SynthesisConfig(length_scale=length_scale))]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


class _EspeakBackend:
    sample_rate = 22_050  # espeak-ng's fixed output rate

    def __init__(self, voice: str = "en-us") -> None:
        self._voice = voice
        self.render("ready", 1.0)  # fail at start, not at the first reply, if the program is broken

    def render(self, sentence: str, speed: float) -> np.ndarray:
        wpm = int(min(max(_ESPEAK_WPM * speed, 80), 450))
        try:
            result = subprocess.run(
                [ESPEAK, "--stdout", "-v", self._voice, "-s", str(wpm), "--stdin"],
                input=sentence.encode(), capture_output=True, timeout=_ESPEAK_TIMEOUT_S, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EngineError(f"espeak-ng failed: {exc}", code="synthesis_failed") from None
        with wave.open(io.BytesIO(result.stdout)) as wav:
            self.sample_rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
        return np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0


class TextToSpeech:
    """The ``TTSEngine``; several sessions share its one voice copy and thread."""

    sample_rate = SAMPLE_RATE

    def __init__(self, location: ModelLocation, *, cpu_threads: int, max_queue: int,
                 metrics: CascadeMetrics) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._cpu_threads = cpu_threads
        self._metrics = metrics
        self._worker = ModelWorker("tts", max_queue)
        self._backend: _Backend | None = None
        voice = "espeak" if location.path is None else location.model_id.removeprefix("piper-")
        self.voices: tuple[str, ...] = (voice,)

    @property
    def ready(self) -> bool:
        return self._backend is not None

    async def start(self) -> None:
        self._worker.start()
        self._backend = await self._worker.run(self._load)
        log.info("TTS %s loaded (%d Hz voice, %d Hz out)", self.model_name, self._backend.sample_rate,
                 SAMPLE_RATE)

    def _load(self) -> _Backend:
        if self._path is None:
            return _EspeakBackend()
        try:
            return _PiperBackend(self._path, self._cpu_threads)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelUnavailable(f"models.tts: cannot load the Piper voice {self._path}: {exc}") from None

    def stop(self) -> None:
        self._worker.stop()

    def check_request(self, voice: str | None, speed: float) -> None:
        if voice is not None and voice not in self.voices and voice not in OPENAI_VOICES:
            raise EngineError(f"unknown voice {voice!r}; this server speaks with {', '.join(self.voices)} "
                              "(OpenAI voice names select it too)", code="invalid_voice")
        if not 0.25 <= speed <= 4.0:
            raise EngineError(f"speed must be in [0.25, 4.0], got {speed}", code="invalid_value")

    async def render(self, sentence: str, speed: float = 1.0) -> np.ndarray:
        """One sentence of speech at 24 kHz (one job on the TTS thread)."""
        if self._backend is None:
            raise ModelNotReady("the speech synthesizer is still loading")
        return await self._worker.run(self._render, self._backend, sentence, speed)

    def _render(self, backend: _Backend, sentence: str, speed: float) -> np.ndarray:
        started = time.perf_counter()
        audio = resample(backend.render(sentence, speed), backend.sample_rate, SAMPLE_RATE)
        self._metrics.model_call_seconds.labels("tts_sentence").observe(time.perf_counter() - started)
        return audio

    async def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncIterator[np.ndarray]:
        """One audio chunk per sentence, each as soon as it is synthesized."""
        self.check_request(voice, speed)
        if self._backend is None:
            raise ModelNotReady("the speech synthesizer is still loading")
        for sentence in split_sentences(text):
            if spoken := speakable(sentence):
                yield await self.render(spoken, speed)
