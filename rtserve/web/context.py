"""What every route handler can reach: config, engines, session manager, codec executor,
metrics registry. The app (``rtserve.app``) builds and runs everything in it; web/ only reads it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.kyutai_tts.service import TTSStreamEngine
from rtserve.engines.protocols import SessionEngine, TurnEngines
from rtserve.sessions import SessionManager
from rtserve.web.codec_executor import CodecExecutor
from rtserve.weights import DownloadStatus


class Engines(Protocol):
    """The engine client: an ``EngineSet`` in this process, ``RemoteEngines`` reaching the
    engine process, or ``ClusterEngines`` reaching Ray engine actors (``rtserve/cluster``).
    Routes see only this surface."""

    @property
    def session_engine(self) -> SessionEngine: ...

    @property
    def turn_engines(self) -> TurnEngines: ...

    @property
    def speech_engine(self) -> TTSStreamEngine | None:
        """The Kyutai TTS engine behind ``/api/tts_streaming`` (``tts_engine.weights``), one per server."""
        ...

    def start(self) -> None:
        """Begin loading or reaching the engines in the background (``ready`` says when done)."""
        ...

    async def stop(self) -> None: ...

    @property
    def ready(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...

    async def policy(self) -> Any: ...

    async def exposition(self, own: bytes) -> bytes: ...

    @property
    def sleeping(self) -> tuple[int, ...]:
        """Sleep mode: stage ids asleep now (new work is refused while any is)."""
        ...

    @property
    def downloading(self) -> DownloadStatus | None:
        """Weights downloading before the engine can load them; None when nothing is."""
        ...

    async def sleep(self, stage_ids: Sequence[int] | None, level: int) -> list[dict[str, Any]]: ...

    async def wake_up(self, stage_ids: Sequence[int] | None) -> list[dict[str, Any]]: ...


@dataclass
class AppContext:
    config: ServerConfig
    engines: Engines
    sessions: SessionManager  # every realtime WebSocket session of this app
    codecs: CodecExecutor  # the one pool every route moves codec work to
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    started_at: float = 0.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set: the serve loop stops (a drain ended)

    @property
    def engine(self) -> SessionEngine:
        return self.engines.session_engine

    @property
    def engine_failure(self) -> str | None:
        """Why the engine is not serving (failed start, engine process gone): /health says it."""
        return self.engines.failure

    @property
    def turn_engines(self) -> TurnEngines:
        return self.engines.turn_engines

    async def policy_batcher(self) -> Any:
        """The robot policy's batcher once loaded; None when none is configured or it failed to load."""
        return await self.engines.policy()


CTX = web.AppKey("rtserve", AppContext)
