"""The cascade ``SessionEngine``: VAD -> ASR -> LLM -> TTS on CPU, the embedded default.

Every model is loaded once (``start``, off the event loop, all four in parallel) and
shared by all sessions; each runs on its own threads, lanes sized from the host's cores
(``cores``, ``worker``, ``llm_stage``). The turn
engines are lent to the HTTP routes by ``turn_engines()``;
they exist from construction and work once ``start`` has returned.

Rates: input 16 kHz (what Silero and Whisper take), or the streaming STT's rate where one hears
(24 kHz for Kyutai: the model hears the client's band, and the session resamples for the VAD
alone); output 24 kHz (Piper's 22.05 kHz resampled, the OpenAI wire rate). Reply audio comes in
40 ms chunks.

With ``cascade.asr: stt_engine`` sessions hear with the streaming Kyutai STT instead of
Whisper (``stream_asr``): this engine builds it (in the engine process, beside the other
models), starts and stops it, and lends it (``turn_engines().stt``) so that
``/api/asr-streaming`` serves from the same model copy (workers over the engine link).

With ``cascade.tts: tts_engine`` sessions speak with the process's Kyutai TTS engine
(``speak_with``), which the engine set lends to the speech routes too: Piper is then never
loaded, listed or lent, and that engine is the TTS sleep stage (docs/engines.md#kyutai-tts-in-the-cascade).
With ``cascade.tts: tts_server`` they speak through a TTS server over the same protocol
(``tts_server``): Piper is not loaded either, no speech route is lent, and the stages that sleep
are VAD, ASR and LLM (the server sleeps its own; docs/engines.md#a-tts-server-in-the-cascade).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.cascade import asr as asr_module
from rtserve.engines.cascade import tts as tts_module
from rtserve.engines.cascade import vad as vad_module
from rtserve.engines.cascade.asr import WhisperAsr
from rtserve.engines.cascade.cores import stage_lanes
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.first_audio import FirstAudioWork
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_asr, resolve_tts, resolve_vad
from rtserve.engines.cascade.session import CascadeModels, CascadeSession
from rtserve.engines.cascade.sessions import CascadeSessions, reply_chain
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.cascade.tts_server import TTSServerStreams
from rtserve.engines.cascade.vad import VadEngine
from rtserve.engines.kyutai_stt.clips import ClipTranscriber
from rtserve.engines.kyutai_tts.service import SleepingSpeechStreams
from rtserve.engines.protocols import SleepStage, TurnEngines
from rtserve.engines.values import EngineCapabilities, SessionOptions

if TYPE_CHECKING:
    from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine

log = logging.getLogger(__name__)

CHUNK_PERIOD_MS = 40
assert vad_module.SAMPLE_RATE == asr_module.SAMPLE_RATE  # one input rate feeds both


class CascadeEngine:
    def __init__(self, config: ServerConfig, registry: CollectorRegistry) -> None:
        paths, limits = config.models, config.cascade
        lanes = stage_lanes(limits)
        self._config = config
        self._registry = registry
        self._metrics = CascadeMetrics(registry)
        first_audio = FirstAudioWork()  # the ASR's and TTS's jobs a turn's first audio waits for
        # Each model's path resolves here, cheaply (a bad one fails naming its config key), and
        # only where this configuration loads the model: the streaming STT hears instead of
        # Whisper, the Kyutai TTS or a TTS server speaks instead of Piper, vLLM answers instead
        # of the embedded LLM.
        self.llm = create_llm(config, self._metrics, first_audio)
        self.stt = _streaming_stt(config, registry)
        self.capabilities = EngineCapabilities(
            name="cascade",
            mode="turn",
            input_sample_rate=asr_module.SAMPLE_RATE if self.stt is None else self.stt.sample_rate,
            output_sample_rate=tts_module.SAMPLE_RATE,
            chunk_period_ms=CHUNK_PERIOD_MS,
            max_sessions=config.sessions.max_sessions,
            supports_barge_in=True,
            supports_server_vad=True,
            supports_semantic_vad=True,
            supports_tools=True,
            supports_speak=True,
            supports_vision=self.llm.supports_vision,
        )
        self.vad = VadEngine(
            resolve_vad(paths), max_queue=limits.worker_queue_depth, metrics=self._metrics, lanes=lanes.vad
        )
        self.asr: WhisperAsr | None = None  # Whisper, where the sessions hear with it
        # The ASR stage (started, stopped, put to sleep) and what transcribes whole clips
        # (transcription requests, chat and item audio): Whisper, or the streaming STT.
        self._hearing: WhisperAsr | KyutaiSttEngine
        self._clips: WhisperAsr | ClipTranscriber
        if self.stt is None:
            self.asr = self._hearing = self._clips = WhisperAsr(
                resolve_asr(paths),
                cpu_threads=paths.cpu_threads,
                max_queue=limits.worker_queue_depth,
                partial_interval_ms=limits.asr_partial_interval_ms,
                max_audio_s=limits.max_turn_audio_s,
                window_s=limits.asr_window_s,
                metrics=self._metrics,
                lanes=lanes.asr,
                first_audio=first_audio,
            )
        else:
            self._hearing, self._clips = self.stt, ClipTranscriber(self.stt, config.http.max_transcription_audio_s)
        self.tts: TextToSpeech | None = None  # Piper, where it speaks the replies
        if limits.tts == "piper":
            self.tts = TextToSpeech(
                resolve_tts(paths),
                cpu_threads=paths.cpu_threads,
                max_queue=limits.worker_queue_depth,
                metrics=self._metrics,
                voice_store=config.voices,
                sleep_drain_timeout_s=limits.sleep_drain_timeout_s,
                lanes=lanes.tts,
                first_audio=first_audio,
            )
        self._models = CascadeModels(
            self.vad, self.asr, reply_chain(self.llm, self.tts, self.capabilities, config, registry, self._metrics)
        )
        self._sessions = CascadeSessions(config, self.capabilities, self._models, self._metrics, self.stt)
        self._ready = False
        self._speech: SleepingSpeechStreams | None = None  # ``speak_with`` took the Kyutai TTS
        self._tts_server: TTSServerStreams | None = None  # or replies are spoken by a TTS server
        if limits.tts == "tts_server":
            self._tts_server = TTSServerStreams(limits.tts_server)
            self._models.reply.speak_with(self._tts_server, registry)

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        speaking = [] if self.tts is None else [self.tts.start()]
        if self._tts_server is not None:  # serving before the first reply needs it (it may be loading)
            speaking.append(self._tts_server.wait_served())
        await asyncio.gather(self.vad.start(), self._hearing.start(), self.llm.start(), *speaking)
        if self.stt is not None and self.stt.failure is not None:
            raise ConfigError(self.stt.failure)  # no session could hear: stop the server, naming the field
        self._ready = True

    async def open_session(self, session_id: str, options: SessionOptions) -> CascadeSession:
        if not self._ready:
            raise ModelNotReady("the cascade models are still loading")
        if any(stage.asleep for stage in self.sleep_stages()):
            raise EngineSleeping()
        return await self._sessions.open(session_id, options)

    async def stop(self) -> None:
        self._ready = False
        await self._sessions.close_all()
        for model in (self.vad, self.asr, self.tts, self.llm):
            if model is not None:
                model.stop()
        if self.stt is not None:
            await self.stt.stop()
        if self._tts_server is not None:
            await self._tts_server.close()

    def speak_with(self, streams: SleepingSpeechStreams) -> bool:
        """The process's Kyutai TTS engine (24 kHz, the output rate): sessions speak with it under
        ``cascade.tts: tts_engine`` (docs/engines.md#kyutai-tts-in-the-cascade)."""
        if self._config.cascade.tts != "tts_engine":
            return False
        self._models.reply.speak_with(streams, self._registry)
        self._speech = streams
        return True

    def model_ids(self) -> list[str]:
        tts = [] if self.tts is None else [self.tts.model_name]
        return [self.llm.model_name, self._clips.model_name, *tts]

    def turn_engines(self) -> TurnEngines:
        # Without Piper the engine set lends the Kyutai TTS, if any.
        return TurnEngines(asr=self._clips, llm=self.llm, tts=self.tts, stt=self.stt)

    def sleep_stages(self) -> tuple[SleepStage, ...]:
        """Stage ids in pipeline order: VAD, ASR (Whisper, or the streaming STT it hears with),
        LLM, TTS (Piper, or the Kyutai TTS engine it speaks with; none when a TTS server speaks:
        docs/serving.md#sleep-mode)."""
        speaking: tuple[SleepStage, ...] = ()
        if self.tts is not None:
            speaking = (self.tts,)
        elif self._speech is not None:
            speaking = (self._speech,)
        return (self.vad, self._hearing, self.llm, *speaking)


def _streaming_stt(config: ServerConfig, registry: CollectorRegistry) -> KyutaiSttEngine | None:
    if config.cascade.asr != "stt_engine":
        return None
    if not config.stt_engine.weights:
        raise ConfigError("cascade.asr 'stt_engine' needs stt_engine.weights (the streaming STT to hear with)")
    from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine  # torch: only when configured

    return KyutaiSttEngine(config, registry=registry)


def create_engine(config: ServerConfig, registry: CollectorRegistry) -> CascadeEngine:
    return CascadeEngine(config, registry)
