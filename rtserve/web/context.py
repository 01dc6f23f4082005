"""What every route handler can reach: config, engine, session manager, turn engines, metrics registry."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.protocols import ASREngine, LLMEngine, SessionEngine, TTSEngine
from rtserve.sessions import SessionManager


@dataclass(frozen=True)
class TurnEngines:
    """The streamed engines behind the HTTP generation routes (chat, speech, transcriptions).

    Filled once by ``rtserve.web.http.routes.setup``: from the session engine when it lends its
    loaded models, and from the configured text engine. ``None`` = this server does not
    serve that task, and its route answers with an error.
    """

    asr: ASREngine | None = None
    llm: LLMEngine | None = None
    tts: TTSEngine | None = None


@dataclass
class AppContext:
    config: ServerConfig
    engine: SessionEngine
    sessions: SessionManager  # every realtime WebSocket session of this app
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    started_at: float = 0.0
    engine_failure: str | None = None  # set when engine.start() failed: /health stays 503
    turn_engines: TurnEngines = field(default_factory=TurnEngines)


CTX = web.AppKey("rtserve", AppContext)
