"""The cascade's realtime sessions in a front-end worker; its models stay in the engine process.

With ``cascade.asr: stt_engine`` and ``cascade.tts: tts_engine`` (or ``tts_server``) under
``--workers N`` every model a cascade session calls is reached from a worker already: the
streaming STT (``RemoteSpeechStreams``), the LLM (``RemoteLLM``; a vLLM server the worker asks
itself) and the Kyutai TTS (``RemoteTTSStreams``; a TTS server the worker speaks through
itself). What is left per session is the VAD, turn detection, the reply chain and the event
plumbing: plain Python that, at a few hundred sessions, kept the engine
process's one event loop and GIL busy between the GPU steps (benchmarks/notes/voice_agent_gpu.md).
So each worker hosts its own sessions with a Silero VAD of its own, and the engine process keeps
the models (docs/engines.md#cascade-sessions-in-workers). Sleep stays the engine process's: a
worker refuses new sessions while any stage sleeps, as the engine process itself does.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade.cores import host_cores, stage_lanes
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_vad
from rtserve.engines.cascade.session import CascadeModels, CascadeSession
from rtserve.engines.cascade.sessions import CascadeSessions, reply_chain
from rtserve.engines.cascade.tts_server import TTSServerStreams
from rtserve.engines.cascade.vad import VadEngine
from rtserve.engines.errors import EngineError
from rtserve.engines.remote.client import RemoteEngines, RemoteLLM, RemoteSessionEngine
from rtserve.engines.remote.speech_streams import RemoteSpeechStreams
from rtserve.engines.remote.tts_streams import RemoteTTSStreams
from rtserve.engines.values import EngineCapabilities, SessionOptions
from rtserve.engines.vllm_engine import VllmTextEngine

log = logging.getLogger(__name__)


def host_cascade_sessions(config: ServerConfig, engines: RemoteEngines, registry: CollectorRegistry) -> None:
    """This worker hosts the cascade's sessions where the configuration says so."""
    limits = config.cascade
    if not (
        config.engine == "cascade"
        and limits.sessions_in_workers
        and limits.asr == "stt_engine"
        and limits.tts in ("tts_engine", "tts_server")
    ):
        return
    remote_llm, stt = engines.turn_engines.llm, engines.turn_engines.stt
    # A TTS server is reached over its WebSocket from anywhere: the worker speaks through it itself.
    speech = TTSServerStreams(limits.tts_server) if limits.tts == "tts_server" else engines.speech_engine
    # The engine process builds all three from the same configuration, or refuses to start.
    assert isinstance(remote_llm, RemoteLLM) and isinstance(stt, RemoteSpeechStreams) and speech is not None
    # A vLLM server is reached over HTTP from anywhere: the worker asks it itself, so no token of a
    # reply crosses the engine process.
    llm = VllmTextEngine(config.http.vllm) if limits.llm_engine == "vllm" else remote_llm
    engines.host_sessions(WorkerCascade(config, engines.remote_sessions, llm, stt, speech, registry))


class WorkerCascade:
    """A ``SessionEngine``: cascade sessions in this worker on the engine process's models."""

    def __init__(
        self,
        config: ServerConfig,
        engine: RemoteSessionEngine,
        llm: RemoteLLM | VllmTextEngine,
        stt: RemoteSpeechStreams,
        speech: RemoteTTSStreams | TTSServerStreams,
        registry: CollectorRegistry,
    ) -> None:
        """``engine``: the engine process's cascade, for what it says (capabilities, readiness,
        sleep); its own sessions are never opened."""
        self._engine = engine
        self._llm = llm
        metrics = CascadeMetrics(registry)
        limits = config.cascade
        # This worker's share of the host: every worker scores its own sessions' audio.
        lanes = stage_lanes(limits, cores=max(1, host_cores() // max(1, config.workers)))
        self.vad = VadEngine(
            resolve_vad(config.models), max_queue=limits.worker_queue_depth, metrics=metrics, lanes=lanes.vad
        )
        capabilities = engine.capabilities
        reply = reply_chain(llm, None, capabilities, config, registry, metrics)
        reply.speak_with(speech, registry)
        self._speech = speech
        self._sessions = CascadeSessions(config, capabilities, CascadeModels(self.vad, None, reply), metrics, stt)
        self._failure: str | None = None

    @property
    def capabilities(self) -> EngineCapabilities:
        return self._engine.capabilities

    @property
    def ready(self) -> bool:
        own_llm = not isinstance(self._llm, VllmTextEngine) or self._llm.ready
        return self.vad.ready and own_llm and self._engine.ready

    @property
    def failure(self) -> str | None:
        return self._failure or self._engine.failure

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        llm = self._llm
        try:
            await asyncio.gather(self.vad.start(), *([llm.start()] if isinstance(llm, VllmTextEngine) else []))
        except EngineError as exc:  # vLLM did not serve in time: its message says where and why
            self._failure = exc.message
        except Exception as exc:
            log.exception("the worker's VAD failed to load")
            self._failure = f"the voice activity detector failed to load: {exc}"

    async def open_session(self, session_id: str, options: SessionOptions) -> CascadeSession:
        if not self.ready:
            raise ModelNotReady("the cascade models are still loading")
        if self._engine.sleeping:
            raise EngineSleeping()
        return await self._sessions.open(session_id, options)

    async def stop(self) -> None:
        await self._sessions.close_all()
        self.vad.stop()
        if isinstance(self._llm, VllmTextEngine):
            self._llm.stop()
        if isinstance(self._speech, TTSServerStreams):
            await self._speech.close()

    def model_ids(self) -> list[str]:
        return self._engine.model_ids()
