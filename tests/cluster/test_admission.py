"""Cluster-wide admission over two engines behind the TCP link (no Ray: what engine actors run).

A session goes to the least-loaded engine with a free slot and stays there; only when every
engine is full is it refused with ``resource_exhausted``; a draining engine takes nothing
new; an engine that dies ends only its own sessions with ``engine_failure``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
from prometheus_client import CollectorRegistry

from rtserve.app import build_app
from rtserve.cluster.engines import ClusterEngines
from rtserve.config import ServerConfig
from tests.cluster.clients import echoes_again, eventually, open_session
from tests.cluster.engines import TcpEngine, connect_to, tcp_engines
from tests.support import serve_app

SLOTS = 2  # per engine


@contextlib.asynccontextmanager
async def front_end(config: ServerConfig) -> AsyncIterator[tuple[str, ClusterEngines, list[TcpEngine]]]:
    config.engine = "loopback"
    config.lockstep.batch_size = SLOTS
    config.sessions.disconnect_grace_s = 0.2  # a client that left frees its slot soon (no resume wait)
    config.sessions.reaper_interval_s = 0.05
    async with tcp_engines(config, 2) as engines:
        registry = CollectorRegistry()
        links = ClusterEngines.links(
            [(f"engine-{i}", connect_to(e)) for i, e in enumerate(engines)],
            config.engine_link,
            worker_index=0,
            registry=registry,
        )
        cluster = await ClusterEngines.connect(links, config.engine_link, startup_timeout_s=30)
        async with serve_app(build_app(config, engines=cluster, registry=registry)) as base:
            await eventually(lambda: cluster.ready, what="the engines to be ready")
            yield base, cluster, engines


def _sessions(cluster: ClusterEngines) -> list[int]:
    return [state["sessions"] for state in cluster.placement().values()]


async def test_sessions_go_to_the_least_loaded_engine_and_are_refused_only_when_all_are_full(
    config: ServerConfig,
) -> None:
    async with front_end(config) as (base, cluster, _), aiohttp.ClientSession() as http:
        first = await open_session(http, base)
        assert first.admitted and _sessions(cluster) == [1, 0]
        second = await open_session(http, base)
        assert second.admitted and _sessions(cluster) == [1, 1]  # the emptier engine, not the first one
        others = [await open_session(http, base) for _ in range(2)]
        assert all(c.admitted for c in others) and _sessions(cluster) == [2, 2]
        refused = await open_session(http, base)
        assert refused.first["type"] == "error" and refused.first["error"]["code"] == "resource_exhausted"
        for client in (first, second, *others):
            assert await echoes_again(client)  # every session streams on its engine
        await first.close()  # it lived on engine-0: that engine has the free slot now
        await eventually(lambda: _sessions(cluster) == [1, 2], what="engine-0's slot to free")
        again = await open_session(http, base)
        assert again.admitted and _sessions(cluster) == [2, 2]
        for client in (second, *others, again):
            await client.close()


async def test_a_draining_engine_takes_no_new_sessions_and_its_own_go_on(config: ServerConfig) -> None:
    async with front_end(config) as (base, cluster, engines), aiohttp.ClientSession() as http:
        on_0, on_1 = await open_session(http, base), await open_session(http, base)
        assert _sessions(cluster) == [1, 1]
        engines[1].server.drain()
        await eventually(lambda: cluster.placement()["engine-1"]["draining"], what="the drain to be seen")
        newcomer = await open_session(http, base)
        assert newcomer.admitted and _sessions(cluster) == [2, 1]
        refused = await open_session(http, base)  # engine-0 is full, engine-1 drains
        assert refused.first["error"]["code"] == "resource_exhausted"
        assert await echoes_again(on_1) and not on_1.errors
        await on_1.close()
        await engines[1].server.wait_idle()
        for client in (on_0, newcomer):
            await client.close()


async def test_an_engine_that_dies_ends_only_its_sessions(config: ServerConfig) -> None:
    async with front_end(config) as (base, cluster, engines), aiohttp.ClientSession() as http:
        on_0, on_1 = await open_session(http, base), await open_session(http, base)
        assert _sessions(cluster) == [1, 1]
        await engines[1].kill()
        await eventually(lambda: bool(on_1.errors), what="engine_failure on engine-1's session")
        assert [e["code"] for e in on_1.errors] == ["engine_failure"]
        assert await echoes_again(on_0) and not on_0.errors
        async with http.get(f"{base}/health") as health:
            assert health.status == 200  # one engine still serves
        newcomer = await open_session(http, base)
        assert newcomer.admitted and _sessions(cluster)[0] == 2
        for client in (on_0, on_1, newcomer):
            await client.close()


async def test_metrics_carry_each_engines_samples_labelled_with_its_name(config: ServerConfig) -> None:
    async with front_end(config) as (base, _, _), aiohttp.ClientSession() as http:
        async with http.get(f"{base}/metrics") as response:
            text = await response.text()
        for name in ("engine-0", "engine-1"):
            assert f'rtserve_lockstep_slots{{engine="{name}"}} {float(SLOTS)}' in text
