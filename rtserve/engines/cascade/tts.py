"""Text to speech: a Piper voice (the shipped ``joe`` voice by default) or espeak-ng.

Audio streams sentence by sentence: each sentence is one job on the TTS thread, so the
first sentence plays while later ones are still being synthesized, and cancelling the
consumer drops every sentence not yet started. Output is always 24 kHz mono float32
(Piper voices are 22.05 kHz; resampled with soxr on the TTS thread), which is the
OpenAI Realtime/speech wire rate, so the common transports pass it through untouched.

espeak-ng is the fallback when the GPL voice wheel (the ``voice`` extra) is absent, or
when ``models.tts`` is ``espeak-ng``; it runs as the system ``espeak-ng`` program.

Voices registered at run time (``voices.py``) are loaded on the TTS thread when first
used; at most ``voices.max_loaded_voices`` stay loaded (least recently used unloaded).
Sleep mode (``release``/``restore``) unloads every voice and loads the built-in one again.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import time
import wave
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import numpy as np

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE
from rtserve.config import VoiceStoreConfig
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady, ModelUnavailable
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ESPEAK, ModelLocation
from rtserve.engines.cascade.sentences import speakable, split_sentences
from rtserve.engines.cascade.voices import VoiceStore
from rtserve.engines.cascade.worker import ModelWorker
from rtserve.engines.protocols import EngineError, VoiceInfo
from rtserve.engines.voice_names import OPENAI_VOICES

log = logging.getLogger(__name__)

SAMPLE_RATE = WIRE_SAMPLE_RATE
_ESPEAK_TIMEOUT_S = 30.0
_ESPEAK_WPM = 175
_PROOF_TEXT = "Hello."


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
        # No busy-waiting between ops: the LLM decodes on the same cores while a reply's first
        # piece is synthesized, and spinning threads slowed that piece by ~45% (2 cores: 404 ms
        # -> 276 ms for "The capital of France is Paris." with the LLM decoding; alone 261 -> 209 ms).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # PiperVoice.load() would use onnxruntime's default (all cores): build it with our bound.
        session = onnxruntime.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._voice = PiperVoice(session=session, config=config)
        self.sample_rate = config.sample_rate

    def render(self, sentence: str, speed: float) -> np.ndarray:
        from piper.config import SynthesisConfig

        length_scale = self._voice.config.length_scale / speed
        chunks = [
            c.audio_float_array for c in self._voice.synthesize(sentence, SynthesisConfig(length_scale=length_scale))
        ]
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
                input=sentence.encode(),
                capture_output=True,
                timeout=_ESPEAK_TIMEOUT_S,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise EngineError(f"espeak-ng failed: {exc}", code="synthesis_failed") from None
        with wave.open(io.BytesIO(result.stdout)) as wav:
            self.sample_rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
        return np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0


class TextToSpeech:
    """The ``TTSEngine``; several sessions share its voice copies and its one thread."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        location: ModelLocation,
        *,
        cpu_threads: int,
        max_queue: int,
        metrics: CascadeMetrics,
        voice_store: VoiceStoreConfig | None = None,
    ) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._cpu_threads = cpu_threads
        self._metrics = metrics
        self._worker = ModelWorker("tts", max_queue)
        self._backend: _Backend | None = None
        self._asleep = False
        self._store_config = voice_store or VoiceStoreConfig()
        self._store = VoiceStore(self._store_config)
        self._loaded: OrderedDict[str, _Backend] = OrderedDict()  # registered voices; TTS thread only
        voice = "espeak" if location.path is None else location.model_id.removeprefix("piper-")
        self.voices: tuple[str, ...] = (voice,)

    @property
    def ready(self) -> bool:
        return self._backend is not None

    async def start(self) -> None:
        self._worker.start()
        self._backend = await self._worker.run(self._load)
        log.info("TTS %s loaded (%d Hz voice, %d Hz out)", self.model_name, self._backend.sample_rate, SAMPLE_RATE)

    def _load(self) -> _Backend:
        if self._path is None:
            return _EspeakBackend()
        try:
            return _PiperBackend(self._path, self._cpu_threads)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelUnavailable(f"models.tts: cannot load the Piper voice {self._path}: {exc}") from None

    def stop(self) -> None:
        self._worker.stop()

    # ------------------------------------------------------------------ sleep mode (``SleepStage``)

    stage = "tts"

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def release(self) -> None:
        self._asleep = True
        await self._worker.run(self._unload)

    def _unload(self) -> None:
        self._backend = None
        self._loaded.clear()

    async def restore(self) -> None:
        self._backend = await self._worker.run(self._load)
        self._asleep = False

    # ------------------------------------------------------------------ voices

    def _reserved(self) -> frozenset[str]:
        return frozenset(self.voices) | OPENAI_VOICES

    async def voice_list(self) -> list[VoiceInfo]:
        rate = 0 if self._backend is None else self._backend.sample_rate
        return [*(VoiceInfo(name, builtin=True, sample_rate=rate) for name in self.voices), *self._store.list()]

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        # Proving an upload loads a whole model: its own thread, so speech goes on meanwhile.
        stored = await asyncio.to_thread(
            self._store.add, name, model, config, reserved=self._reserved(), prove=self._prove
        )
        log.info("voice %r registered (%d bytes)", name, stored.info.file_size)
        return stored.info

    def _prove(self, model_path: Path) -> np.ndarray:
        return _PiperBackend(model_path, self._cpu_threads).render(_PROOF_TEXT, 1.0)

    async def remove_voice(self, name: str) -> None:
        if name in self._reserved():
            raise EngineError(
                f"the voice {name!r} is built in and cannot be deleted", code="voice_not_deletable", param="name"
            )
        await asyncio.to_thread(self._store.remove, name)
        await self._worker.run(self._loaded.pop, name, None)
        log.info("voice %r deleted", name)

    def _backend_for(self, voice: str | None) -> _Backend:
        """The voice's model, loaded on first use (TTS thread only)."""
        if self._backend is None:
            raise EngineSleeping() if self._asleep else ModelNotReady("the speech synthesizer is still loading")
        if voice is None or voice in self._reserved():
            return self._backend
        if (backend := self._loaded.get(voice)) is not None:
            self._loaded.move_to_end(voice)
            return backend
        stored = self._store.get(voice)
        if stored is None:
            raise EngineError(f"the voice {voice!r} was deleted", code="invalid_voice")
        backend = _PiperBackend(stored.model_path, self._cpu_threads)
        self._loaded[voice] = backend
        while len(self._loaded) > self._store_config.max_loaded_voices:
            self._loaded.popitem(last=False)
        return backend

    def check_request(self, voice: str | None, speed: float) -> None:
        if self._asleep:
            raise EngineSleeping()
        if voice is not None and voice not in self._reserved() and self._store.get(voice) is None:
            registered = [v.name for v in self._store.list()]
            raise EngineError(
                f"unknown voice {voice!r}; this server speaks with "
                f"{', '.join([*self.voices, *registered])} (OpenAI voice names select "
                f"{self.voices[0]} too)",
                code="invalid_voice",
            )
        if not 0.25 <= speed <= 4.0:
            raise EngineError(f"speed must be in [0.25, 4.0], got {speed}", code="invalid_value")

    # ------------------------------------------------------------------ speech

    async def render(self, sentence: str, speed: float = 1.0, voice: str | None = None) -> np.ndarray:
        """One sentence of speech at 24 kHz (one job on the TTS thread)."""
        if self._backend is None:
            raise EngineSleeping() if self._asleep else ModelNotReady("the speech synthesizer is still loading")
        return await self._worker.run(self._render, voice, sentence, speed)

    def _render(self, voice: str | None, sentence: str, speed: float) -> np.ndarray:
        started = time.perf_counter()
        backend = self._backend_for(voice)
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
                yield await self.render(spoken, speed, voice)
