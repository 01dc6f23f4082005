"""The open sessions of one cascade: opening them (capacity, a streaming STT stream each),
counting them, closing them all.

Shared by the cascade engine, whose models are all in this process, and by a front-end
worker's ``WorkerCascade`` (``remote/worker_cascade.py``), whose STT, LLM and TTS are the
engine process's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.reply import ReplyChain
from rtserve.engines.cascade.session import CascadeModels, CascadeSession
from rtserve.engines.cascade.stream_asr import StreamAsr
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.errors import CapacityExhausted
from rtserve.engines.events import EngineEvent
from rtserve.engines.kyutai_stt.service import SpeechStreamEngine
from rtserve.engines.protocols import LLMEngine
from rtserve.engines.values import EngineCapabilities, SessionOptions


def reply_chain(
    llm: LLMEngine,
    tts: TextToSpeech | None,
    capabilities: EngineCapabilities,
    config: ServerConfig,
    registry: CollectorRegistry,
    metrics: CascadeMetrics,
) -> ReplyChain:
    """The reply chain of a cascade's sessions; ``tts`` None: it speaks with streams (``speak_with``)."""
    limits = config.cascade
    return ReplyChain(
        llm,
        tts,
        registry,
        metrics,
        chunk_samples=capabilities.output_sample_rate * capabilities.chunk_period_ms // 1000,
        first_piece_max_chars=limits.first_piece_max_chars,
        first_clause_min_chars=limits.first_clause_min_chars,
    )


class CascadeSessions:
    def __init__(
        self,
        config: ServerConfig,
        capabilities: EngineCapabilities,
        models: CascadeModels,
        metrics: CascadeMetrics,
        stt: SpeechStreamEngine | None,
    ) -> None:
        """``stt``: every session hears with a stream of it; None: with ``models.asr`` (Whisper)."""
        self._config = config
        self._capabilities = capabilities
        self._models = models
        self._metrics = metrics
        self._stt = stt
        self._open: set[CascadeSession] = set()

    def __len__(self) -> int:
        return len(self._open)

    async def open(self, session_id: str, options: SessionOptions) -> CascadeSession:
        """A new session, or ``CapacityExhausted`` (this cascade's limit, or no free STT stream)."""
        limit = self._capabilities.max_sessions
        if len(self._open) >= limit:
            raise CapacityExhausted(f"all {limit} cascade sessions are in use")
        hearing = await self._hearing(session_id)
        session = CascadeSession(
            session_id,
            self._capabilities,
            self._models,
            options,
            self._config.cascade,
            self._config.sessions.max_pending_turns_per_session,
            self._metrics,
            on_close=self._forget,
            hearing=hearing,
        )
        self._open.add(session)
        self._metrics.sessions.set(len(self._open))
        return session

    async def _hearing(self, session_id: str) -> Callable[[Callable[[EngineEvent], None]], StreamAsr] | None:
        stt = self._stt
        if stt is None:
            return None
        stream = await stt.open_stream(session_id)
        rate = self._capabilities.input_sample_rate
        return lambda report: StreamAsr(stream, rate, stt.sample_rate, stt.release_timeout_s, report)

    def _forget(self, session: CascadeSession) -> None:
        self._open.discard(session)
        self._metrics.sessions.set(len(self._open))

    async def close_all(self) -> None:
        await asyncio.gather(*(session.close() for session in list(self._open)), return_exceptions=True)
