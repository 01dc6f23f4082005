"""Front-ends of the local two-raylet Ray cluster (``conftest.ray_cluster``): the config one
joins with, serving it on 127.0.0.1, and the named engine actors it finds or creates."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import ray
from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.app import build_app
from rtserve.cluster.directory import cluster_peers
from rtserve.cluster.engines import ClusterEngines
from rtserve.cluster.frontend import cluster_engines
from rtserve.cluster.placement import engine_names
from rtserve.config import ServerConfig, load_config
from tests.cluster.clients import eventually
from tests.support import serve_app

NAMESPACE = "rtserve-test"
SECRET = "test-cluster-secret-0123456789"


def cluster_config(address: str, *, engine: str, prefix: str) -> ServerConfig:
    """Two engine actors named ``prefix-0``/``-1``, one per raylet, reached on 127.0.0.1."""
    config = load_config(environ={})
    config.engine = engine
    config.peers.host = "127.0.0.1"
    config.cluster = config.cluster.model_copy(
        update={
            "address": address,
            "namespace": NAMESPACE,
            "engine_prefix": prefix,
            "engines": 2,
            "engine_resources": {"rtserve_engine": 1},
            "placement_strategy": "STRICT_SPREAD",
            "secret": SECRET,
            "engine_host": "127.0.0.1",
            "startup_timeout_s": 90,
        }
    )
    return config


@contextlib.asynccontextmanager
async def front_end(
    config: ServerConfig,
    worker_index: int = 0,
    apps: list[web.Application] | None = None,
    *,
    serving_timeout_s: float = 90,
) -> AsyncIterator[tuple[str, ClusterEngines]]:
    """A front-end served on 127.0.0.1 once every engine actor serves: (base URL, its engines)."""
    registry = CollectorRegistry()
    engines = await cluster_engines(config, registry, worker_index=worker_index)
    app = build_app(config, engines=engines, registry=registry, peers=await cluster_peers(config))
    if apps is not None:
        apps.append(app)
    async with serve_app(app) as base:
        await eventually(lambda: all(m.serving for m in engines.members), serving_timeout_s, "every engine to serve")
        yield base, engines


def engine_actor(prefix: str, index: int) -> Any:
    return ray.get_actor(f"{prefix}-{index}", namespace=NAMESPACE)


def kill_engines(config: ServerConfig) -> None:
    """Detached actors outlive their front-ends: end them for good."""
    for name in engine_names(config.cluster):
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
