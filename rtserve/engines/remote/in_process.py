"""An ``EngineSet`` behind the engine link inside one process, over a socket pair.

Everything a worker does to reach the engine process happens here too (pickled
messages, per-tick batching, streams, reconnects), minus the second process. The test
suite runs whole a second time this way, so every route is checked over the link.
"""

from __future__ import annotations

import asyncio
import socket

from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.remote.client import RemoteEngines
from rtserve.engines.remote.link import EngineLink
from rtserve.engines.remote.offer import offer_of
from rtserve.engines.remote.server import EngineServer
from rtserve.engines.remote.worker_cascade import host_cascade_sessions


class LinkedEngines(RemoteEngines):
    def __init__(self, local: EngineSet, config: ServerConfig) -> None:
        self._local = local
        self._server = EngineServer(local)
        self._serving: set[asyncio.Task[None]] = set()
        settings = config.engine_link
        link = EngineLink(
            self._connect,
            worker_index=0,
            settings=settings,
            metrics=self._server.metrics,
        )  # one registry here: both sides share the metrics
        super().__init__(link, offer_of(local), max_queued_events=settings.max_queued_events)
        # The sessions' own metrics in a registry apart: the engine's cascade already holds those names here.
        host_cascade_sessions(config, self, CollectorRegistry())

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ours, theirs = socket.socketpair()
        server_side = await asyncio.open_connection(sock=theirs)
        task = asyncio.create_task(self._server.serve_connection(*server_side))
        self._serving.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._serving.discard)
        return await asyncio.open_connection(sock=ours)

    def start(self) -> None:
        self._local.start()
        super().start()

    async def exposition(self, own: bytes) -> bytes:
        return own  # the engines' metrics are in this process's registry already

    async def stop(self) -> None:
        await super().stop()
        await self._server.close()
        await self._local.stop()
