"""Text to speech: a Piper voice (the shipped ``joe`` voice by default) or espeak-ng.

Audio streams sentence by sentence: each sentence is one job on a TTS lane, so the
first sentence plays while later ones are still being synthesized, and cancelling the
consumer drops every sentence not yet started. ``lanes`` sentences are spoken at once
(``cascade.tts_lanes``; onnxruntime runs concurrent calls on one session), and a reply's
first piece goes before other replies' later sentences (``urgent``): those already have
audio playing, a new reply has none yet. Output is always 24 kHz mono float32
(Piper voices are 22.05 kHz; resampled with soxr on the TTS thread), which is the
OpenAI Realtime/speech wire rate, so the common transports pass it through untouched.

espeak-ng is the fallback when the GPL voice wheel (the ``voice`` extra) is absent, or
when ``models.tts`` is ``espeak-ng``; it runs as the system ``espeak-ng`` program.

Voices registered at run time (``voices.py``) are user-supplied models: they are proven
and spoken in a sandbox child process with memory, CPU and wall-clock limits
(``voice_sandbox.py``), from their own thread, so a slow or hostile upload never holds the
thread the built-in voice speaks on. Uploads are proven on their own small pool, at most
``voices.max_concurrent_uploads`` at once (429 beyond), never on the default executor.
Every voice stops speaking once its audio is longer than ``voices.max_speech_s_per_char``
allows for the text (checked per Piper sentence, as the audio is produced).
Sleep mode (``release``/``restore``) unloads every voice and loads the built-in one again.
"""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import time
import wave
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray
from rtserve.config import VoiceStoreConfig
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady, ModelUnavailable
from rtserve.engines.cascade.first_audio import FirstAudioWork
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ESPEAK, ModelLocation
from rtserve.engines.cascade.sentences import speakable, split_sentences
from rtserve.engines.cascade.voice_sandbox import (
    SandboxLimits,
    SpeechTooLong,
    VoiceModelRejected,
    VoiceSandbox,
    speech_sample_bound,
)
from rtserve.engines.cascade.voices import StoredVoice, VoiceStore, sample_rate_of
from rtserve.engines.cascade.worker import PRIORITY_HIGH, PRIORITY_LOW, ModelWorker
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.piper_voice import PiperModel
from rtserve.engines.values import VoiceInfo
from rtserve.engines.voice_names import OPENAI_VOICES
from rtserve.errors import INVALID_VALUE, INVALID_VOICE, STAGE_BUSY, SYNTHESIS_FAILED, VOICE_NOT_DELETABLE

log = logging.getLogger(__name__)

SAMPLE_RATE = WIRE_SAMPLE_RATE
_ESPEAK_TIMEOUT_S = 30.0
_ESPEAK_WPM = 175
_PROOF_TEXT = "Hello."


class _Backend(Protocol):
    sample_rate: int

    def chunks(self, sentence: str, speed: float) -> Iterator[FloatArray]: ...


class _EspeakBackend:
    sample_rate = 22_050  # espeak-ng's fixed output rate

    def __init__(self, voice: str = "en-us") -> None:
        self._voice = voice
        self._render("ready", 1.0)  # fail at start, not at the first reply, if the program is broken

    def chunks(self, sentence: str, speed: float) -> Iterator[FloatArray]:
        yield self._render(sentence, speed)

    def _render(self, sentence: str, speed: float) -> FloatArray:
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
            raise EngineError(f"espeak-ng failed: {exc}", code=SYNTHESIS_FAILED) from None
        with wave.open(io.BytesIO(result.stdout)) as wav:
            self.sample_rate = wav.getframerate()
            frames = wav.readframes(wav.getnframes())
        return np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0


class TextToSpeech:
    """The ``TTSEngine``; several sessions share its voice copies and its lanes."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        location: ModelLocation,
        *,
        cpu_threads: int,
        max_queue: int,
        metrics: CascadeMetrics,
        voice_store: VoiceStoreConfig | None = None,
        sleep_drain_timeout_s: float = 30.0,
        lanes: int = 1,
        first_audio: FirstAudioWork | None = None,
    ) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._cpu_threads = cpu_threads
        self._metrics = metrics
        self._worker = ModelWorker("tts", max_queue, lanes, first_audio)
        self._backend: _Backend | None = None
        self._asleep = False
        # Speech in flight (a ``synthesize`` stream not yet ended): sleep lets it finish first.
        self._speaking = 0
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._sleep_drain_timeout_s = sleep_drain_timeout_s
        self._store_config = voice_store or VoiceStoreConfig()
        self._store = VoiceStore(self._store_config)
        # Registered voices speak in one sandbox child, driven from their own thread only.
        self._voices_worker = ModelWorker("tts-voices", max_queue)
        self._sandbox = VoiceSandbox(self._sandbox_limits(self._store_config.max_loaded_voices))
        self._uploads = ThreadPoolExecutor(self._store_config.max_concurrent_uploads, "rtserve-voice-upload")
        self._uploading = 0  # event loop only
        voice = "espeak" if location.path is None else location.model_id.removeprefix("piper-")
        self.voices: tuple[str, ...] = (voice,)

    @property
    def ready(self) -> bool:
        return self._backend is not None

    async def start(self) -> None:
        self._worker.start()
        self._voices_worker.start()
        self._backend = await self._worker.run(self._load)
        log.info("TTS %s loaded (%d Hz voice, %d Hz out)", self.model_name, self._backend.sample_rate, SAMPLE_RATE)

    def _load(self) -> _Backend:
        if self._path is None:
            return _EspeakBackend()
        try:
            return PiperModel(self._path, self._cpu_threads)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelUnavailable(f"models.tts: cannot load the Piper voice {self._path}: {exc}") from None

    def stop(self) -> None:
        self._worker.stop()
        self._voices_worker.stop()
        self._sandbox.kill()  # ends a sentence in flight at once; the worker thread then stops
        self._uploads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ sleep mode (``SleepStage``)

    stage = "tts"

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def release(self) -> None:
        """New speech is refused from here on; speech in flight finishes first (a client gets the
        whole audio, never a body cut short), for at most ``cascade.sleep_drain_timeout_s``."""
        self._asleep = True
        try:
            await asyncio.wait_for(self._quiet.wait(), self._sleep_drain_timeout_s)
        except TimeoutError:
            self._asleep = False
            raise EngineError(
                f"the TTS stage still has speech in flight after {self._sleep_drain_timeout_s:g} s "
                "(cascade.sleep_drain_timeout_s); it stays awake, try the sleep again",
                code=STAGE_BUSY,
            ) from None
        await self._worker.run(self._unload)
        await self._voices_worker.run(self._sandbox.close)

    def _unload(self) -> None:
        self._backend = None

    async def restore(self) -> None:
        self._backend = await self._worker.run(self._load)
        self._asleep = False

    # ------------------------------------------------------------------ voices

    def _reserved(self) -> frozenset[str]:
        return frozenset(self.voices) | OPENAI_VOICES

    async def voice_list(self) -> list[VoiceInfo]:
        rate = 0 if self._backend is None else self._backend.sample_rate
        return [*(VoiceInfo(name, builtin=True, sample_rate=rate) for name in self.voices), *self._store.list()]

    def _sandbox_limits(self, max_loaded: int) -> SandboxLimits:
        config = self._store_config
        return SandboxLimits(
            memory_bytes=config.sandbox_memory_bytes,
            cpu_s=config.sandbox_cpu_s,
            wall_s=config.sandbox_wall_s,
            cpu_threads=self._cpu_threads,
            max_loaded=max_loaded,
        )

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        # Proving an upload runs a whole model in a sandbox child: on the uploads' own pool, at most
        # voices.max_concurrent_uploads at once. Past that the upload is refused at once (429, as
        # every other capacity refusal here) instead of queueing a 128 MiB body behind the others.
        limit = self._store_config.max_concurrent_uploads
        if self._uploading >= limit:
            raise CapacityExhausted(
                f"{limit} voice uploads are being proven (voices.max_concurrent_uploads); retry shortly"
            )
        self._uploading += 1
        try:
            add = lambda: self._store.add(name, model, config, reserved=self._reserved(), prove=self._prove)  # noqa: E731
            stored = await asyncio.get_running_loop().run_in_executor(self._uploads, add)
        finally:
            self._uploading -= 1
        log.info("voice %r registered (%d bytes)", name, stored.info.file_size)
        return stored.info

    def _prove(self, model_path: Path) -> FloatArray:
        """``_PROOF_TEXT`` spoken by an upload in a sandbox of its own, within the same bounds as speech."""
        sandbox = VoiceSandbox(self._sandbox_limits(1))
        try:
            # The config was checked before: its rate bounds the audio before the model ever ran.
            rate = sample_rate_of(model_path)
            bound = speech_sample_bound(_PROOF_TEXT, 1.0, self._store_config.max_speech_s_per_char, rate)
            audio, _ = sandbox.speak(model_path, str(model_path), _PROOF_TEXT, 1.0, bound, param="model")
        except SpeechTooLong:
            raise VoiceModelRejected(
                f"the voice model said {_PROOF_TEXT!r} with more audio than voices.max_speech_s_per_char allows",
                param="model",
            ) from None
        finally:
            sandbox.close()
        return audio

    async def remove_voice(self, name: str) -> None:
        if name in self._reserved():
            raise EngineError(
                f"the voice {name!r} is built in and cannot be deleted", code=VOICE_NOT_DELETABLE, param="name"
            )
        stored = self._store.get(name)
        key = _sandbox_key(stored) if stored is not None else None  # before its file goes
        self._store.remove(name)
        if key is not None:  # the sandbox child may hold its model: freed with its next request
            self._sandbox.forget(key)
        log.info("voice %r deleted", name)

    def check_request(self, voice: str | None, speed: float) -> None:
        if self._asleep:
            raise EngineSleeping()
        if voice is not None and voice not in self._reserved() and self._store.get(voice) is None:
            registered = [v.name for v in self._store.list()]
            raise EngineError(
                f"unknown voice {voice!r}; this server speaks with "
                f"{', '.join([*self.voices, *registered])} (OpenAI voice names select "
                f"{self.voices[0]} too)",
                code=INVALID_VOICE,
            )
        if not 0.25 <= speed <= 4.0:
            raise EngineError(f"speed must be in [0.25, 4.0], got {speed}", code=INVALID_VALUE)

    # ------------------------------------------------------------------ speech

    async def render(
        self, sentence: str, speed: float = 1.0, voice: str | None = None, *, urgent: bool = True
    ) -> FloatArray:
        """One sentence of speech at 24 kHz (one job on a TTS lane); not ``urgent`` (a reply's
        later sentences, while its earlier audio plays) waits for urgent ones."""
        if self._backend is None:
            raise EngineSleeping() if self._asleep else ModelNotReady("the speech synthesizer is still loading")
        if voice is None or voice in self._reserved():
            priority = PRIORITY_HIGH if urgent else PRIORITY_LOW
            return await self._worker.run(self._render, sentence, speed, priority=priority)
        stored = self._store.get(voice)
        if stored is None:
            raise EngineError(f"the voice {voice!r} was deleted", code=INVALID_VOICE)
        return await self._voices_worker.run(self._render_registered, stored, sentence, speed)

    def _render(self, sentence: str, speed: float) -> FloatArray:
        """The built-in voice, on a TTS lane: stops at the first piece past the length bound."""
        started = time.perf_counter()
        backend = self._backend
        if backend is None:
            raise EngineSleeping() if self._asleep else ModelNotReady("the speech synthesizer is still loading")
        bound = speech_sample_bound(sentence, speed, self._store_config.max_speech_s_per_char, backend.sample_rate)
        pieces: list[FloatArray] = []
        samples = 0
        for piece in backend.chunks(sentence, speed):
            samples += piece.size
            if samples > bound:
                raise SpeechTooLong(
                    "the speech is longer than voices.max_speech_s_per_char allows for its text", param="input"
                )
            pieces.append(piece)
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        audio = resample(audio, backend.sample_rate, SAMPLE_RATE)
        self._metrics.model_call_seconds.labels("tts_sentence").observe(time.perf_counter() - started)
        return audio

    def _render_registered(self, stored: StoredVoice, sentence: str, speed: float) -> FloatArray:
        """A registered voice, in the sandbox child (this runs on the registered voices' thread)."""
        started = time.perf_counter()
        rate = stored.info.sample_rate
        bound = speech_sample_bound(sentence, speed, self._store_config.max_speech_s_per_char, rate)
        audio, rate = self._sandbox.speak(
            stored.model_path, _sandbox_key(stored), sentence, speed, bound, param="voice"
        )
        audio = resample(audio, rate, SAMPLE_RATE)
        self._metrics.model_call_seconds.labels("tts_sentence").observe(time.perf_counter() - started)
        return audio

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0
    ) -> AsyncGenerator[FloatArray, None]:
        """One audio chunk per sentence, each as soon as it is synthesized."""
        self.check_request(voice, speed)
        if self._backend is None:
            raise ModelNotReady("the speech synthesizer is still loading")
        self._speaking += 1
        self._quiet.clear()
        try:
            for sentence in split_sentences(text):
                if spoken := speakable(sentence):
                    yield await self.render(spoken, speed, voice)
        finally:
            self._speaking -= 1
            if not self._speaking:
                self._quiet.set()


def _sandbox_key(stored: StoredVoice) -> str:
    """The sandbox child's name for a voice's model: its file's identity, so a voice deleted and
    registered again under the same name is never served from the old model."""
    file = stored.model_path.stat()
    return f"{stored.model_path}:{file.st_ino}:{file.st_mtime_ns}"
