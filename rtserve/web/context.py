"""What every route handler can reach: config, engines, session manager, codec executor,
metrics registry. The app (``rtserve.app``) builds and runs everything in it; web/ only reads it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.policy.batcher import PolicyBatcher
from rtserve.engines.protocols import SessionEngine, TurnEngines
from rtserve.sessions import SessionManager
from rtserve.web.codec_executor import CodecExecutor


@dataclass
class AppContext:
    config: ServerConfig
    engine: SessionEngine
    sessions: SessionManager  # every realtime WebSocket session of this app
    codecs: CodecExecutor  # the one pool every route moves codec work to
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    started_at: float = 0.0
    engine_failure: str | None = None  # set when engine.start() failed: /health stays 503
    turn_engines: TurnEngines = field(default_factory=TurnEngines)
    policy_loading: asyncio.Task[PolicyBatcher | None] | None = None  # the robot policy, loading from startup

    async def policy_batcher(self) -> PolicyBatcher | None:
        """The robot policy's running batcher once loaded; None when none is configured or it failed to load."""
        return None if self.policy_loading is None else await asyncio.shield(self.policy_loading)


CTX = web.AppKey("rtserve", AppContext)
