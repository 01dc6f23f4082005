"""Engine servers behind the cluster handshake on 127.0.0.1, without Ray: what an engine actor runs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from rtserve.cluster import auth
from rtserve.config import ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.remote.server import EngineServer

SECRET = b"0123456789abcdef-cluster-secret"


@dataclass
class TcpEngine:
    engines: EngineSet
    server: EngineServer
    listener: asyncio.Server

    @property
    def port(self) -> int:
        return self.listener.sockets[0].getsockname()[1]

    async def kill(self) -> None:
        """What the front-end sees when the engine's process dies: every link breaks."""
        self.listener.close()
        await self.server.close()
        await self.engines.stop()


async def tcp_connect(port: int, secret: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await auth.connect(reader, writer, secret, 5.0)
    except ConnectionError:
        writer.close()
        raise
    return reader, writer


def connect_to(engine: TcpEngine, secret: bytes = SECRET):  # -> ClusterEngines' Connect
    return functools.partial(tcp_connect, engine.port, secret)


@contextlib.asynccontextmanager
async def tcp_engines(config: ServerConfig, count: int) -> AsyncIterator[list[TcpEngine]]:
    started: list[TcpEngine] = []
    try:
        for _ in range(count):
            engines = EngineSet(config, CollectorRegistry())
            server = EngineServer(engines)
            listener = await asyncio.start_server(
                auth.authenticated(server.serve_connection, SECRET, 5.0), "127.0.0.1", 0
            )
            engines.start()
            started.append(TcpEngine(engines, server, listener))
        yield started
    finally:
        for engine in started:
            if engine.listener.is_serving():
                await engine.kill()
