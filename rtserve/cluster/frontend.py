"""A front-end joining the cluster: ``ray.init``, find or create the engine actors, link to each.

The link to an actor is (re)opened by ``ActorConnector``: ask the actor where it listens
(after a restart that is a new port), connect over TCP, run the secret handshake. The
link retries a failed connect by itself, so a restarted actor is reached again and an
actor that was drained away is looked up by name until one with that name exists again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from prometheus_client import CollectorRegistry

from rtserve.cluster import auth
from rtserve.cluster.engines import ClusterEngines
from rtserve.cluster.placement import start_engines
from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.registry import ENGINES
from rtserve.engines.remote.link import EngineLink

log = logging.getLogger(__name__)

_ABSENT_RETRY_S = 2.0  # an actor that no longer exists (drained) is looked up this often


def join_cluster(config: ServerConfig) -> None:
    """``ray.init`` once per process (front-ends of one host share nothing but the cluster)."""
    cluster = config.cluster
    if cluster.secret is None:
        raise ConfigError(
            "invalid config field 'cluster.secret': required with a Ray address "
            "(set RTSERVE_CLUSTER__SECRET to the same value on every front-end)"
        )
    if config.engine not in ENGINES:  # fail here, not in actors Ray would restart forever
        raise ConfigError(
            f"invalid config field 'engine': unknown engine {config.engine!r} (known: {', '.join(sorted(ENGINES))})"
        )
    if not ray.is_initialized():
        ray.init(
            address=cluster.address, namespace=cluster.namespace, log_to_driver=False, logging_level=logging.WARNING
        )


class ActorConnector:
    """``EngineLink``'s connect(): the actor's current address, TCP, the secret handshake."""

    def __init__(self, name: str, handle: Any, config: ServerConfig) -> None:
        assert config.cluster.secret is not None
        self.name = name
        self.link: EngineLink | None = None  # told the engine's clock offset on each connect
        self._handle = handle
        self._namespace = config.cluster.namespace
        self._secret = config.cluster.secret.encode()
        self._timeout_s = config.cluster.connect_timeout_s
        self._reachable = True

    async def __call__(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            host, port = await asyncio.wait_for(self._handle.address.remote(), self._timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as exc:  # restarting, gone, or Ray itself unreachable
            await self._look_up_again(exc)
            raise ConnectionError(f"engine actor {self.name} is not reachable") from None
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self._timeout_s)
        try:
            offset = await auth.connect(reader, writer, self._secret, self._timeout_s)
        except ConnectionError as exc:  # a wrong secret, or a handshake that did not finish in time
            writer.close()
            log.error(
                "engine actor %s at %s:%d: %s (is cluster.secret the same on every front-end?)",
                self.name,
                host,
                port,
                exc,
            )
            raise
        if self.link is not None:
            self.link.clock_offset_s = offset
        if not self._reachable:
            log.info("engine actor %s reachable again at %s:%d", self.name, host, port)
        self._reachable = True
        return reader, writer

    async def _look_up_again(self, exc: BaseException) -> None:
        """A restarting actor answers later on the same handle; a drained one is gone, and a
        later front-end may create a new one under its name."""
        if self._reachable:
            log.warning("engine actor %s is not reachable (%s); retrying", self.name, type(exc).__name__)
        self._reachable = False
        if isinstance(exc, ray.exceptions.ActorDiedError):
            try:
                self._handle = await asyncio.to_thread(ray.get_actor, self.name, namespace=self._namespace)
            except ValueError:
                await asyncio.sleep(_ABSENT_RETRY_S)


async def cluster_engines(config: ServerConfig, registry: CollectorRegistry, worker_index: int) -> ClusterEngines:
    join_cluster(config)
    handles = await asyncio.to_thread(start_engines, config)
    connectors = [ActorConnector(name, handle, config) for name, handle in handles]
    links = ClusterEngines.links(
        [(c.name, c) for c in connectors], config.engine_link, worker_index=worker_index, registry=registry
    )
    for connector, (_, link) in zip(connectors, links):
        connector.link = link
    return await ClusterEngines.connect(links, config.engine_link, startup_timeout_s=config.cluster.startup_timeout_s)
