"""One engine process of the cluster, as a Ray actor: an ``EngineSet`` behind ``EngineServer``.

Ray places the actor, restarts it when its process dies (``max_restarts``) and names it so
every front-end finds it; the actor itself only serves the engine link on a TCP port of its
node, where each connection must prove the cluster secret before a message is read
(``auth.py``). A restarted actor listens on a new port; front-ends ask ``address()`` again
when their link breaks.

Drain: ``drain(deadline_s)`` opens no new sessions (front-ends see it in the offer and go
elsewhere), and once the last session ended, or at the deadline, closes the link (sessions
still open end with ``engine_failure``) and removes the actor for good (no restart).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray
from prometheus_client import CollectorRegistry

from rtserve.cluster import auth
from rtserve.config import ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.remote.server import EngineServer
from rtserve.heap import freeze_when_ready
from rtserve.log import configure_logging
from rtserve.process_metrics import ProcessMetrics

log = logging.getLogger("rtserve.cluster.engine")


class EngineActor:
    # Ray awaits an async actor's constructor in the actor's event loop, where the listener must
    # start; Python's typing knows only synchronous constructors.
    async def __init__(self, settings: dict[str, Any], name: str, secret: str) -> None:  # type: ignore[misc]
        config = ServerConfig.model_validate(settings)
        configure_logging(config.log_level)
        self.name = name
        registry = CollectorRegistry()
        self._process_metrics = ProcessMetrics(registry)
        self._engines = EngineSet(config, registry)
        self._server = EngineServer(self._engines, max_send_buffer_bytes=config.engine_link.max_send_buffer_bytes)
        host = config.cluster.engine_host or ray.util.get_node_ip_address()
        serve = auth.authenticated(self._server.serve_connection, secret.encode(), config.cluster.connect_timeout_s)
        self._listener = await asyncio.start_server(serve, host, 0)
        self._address: tuple[str, int] = self._listener.sockets[0].getsockname()[:2]
        self._engines.start()
        self._process_metrics.start()
        freeze_when_ready(self._engines)
        self._drained: asyncio.Task[None] | None = None
        log.info("engine actor %s serving on %s:%d (pid %d)", name, *self._address, os.getpid())

    async def address(self) -> tuple[str, int]:
        """Where front-ends connect (changes when Ray restarts the actor)."""
        return self._address

    async def placement(self) -> dict[str, Any]:
        """Which node and process this engine runs on, and its load."""
        return {
            "name": self.name,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "address": self._address,
            "sessions": self._server.session_count(),
            "draining": self._server.draining,
        }

    async def drain(self, deadline_s: float) -> int:
        """Take no new sessions; leave once the open ones end or at the deadline. Returns the
        sessions open now."""
        self._server.drain()
        if self._drained is None:
            self._drained = asyncio.create_task(self._leave_when_idle(deadline_s))
        log.info(
            "engine actor %s draining: %d sessions open, deadline %.0f s",
            self.name,
            self._server.session_count(),
            deadline_s,
        )
        return self._server.session_count()

    async def _leave_when_idle(self, deadline_s: float) -> None:
        try:
            await asyncio.wait_for(self._server.wait_idle(), deadline_s)
        except TimeoutError:
            log.warning(
                "engine actor %s: drain deadline passed with %d sessions open; ending them",
                self.name,
                self._server.session_count(),
            )
        self._listener.close()
        await self._server.close()
        await self._process_metrics.stop()
        await self._engines.stop()
        log.info("engine actor %s drained; leaving the cluster", self.name)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
