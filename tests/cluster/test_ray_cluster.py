"""Engines as Ray actors on a local cluster of two raylets (one engine actor each, loopback engine).

One cluster for the package (``conftest.ray_cluster``: starting Ray is the slow part); each
test joins it as a front-end (``cluster_engines``: find or create the named actors, link to
each over TCP + handshake). Order matters: the kill test restarts engine 1, the drain test
removes it for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import aiohttp
import pytest
from aiohttp import web

from rtserve.cluster.engines import ClusterEngines
from rtserve.web.context import CTX
from tests.cluster.clients import drop_and_resume, echoes_again, eventually, open_session
from tests.test_cli import CLEAN_ENV, _free_port
from tests.web.realtime_support import echoed_tags, ws_url

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from rtserve.cluster.directory import DIRECTORY_NAME, RayDirectory, directory_actor  # noqa: E402
from tests.cluster import ray_support  # noqa: E402
from tests.cluster.ray_support import NAMESPACE, SECRET, cluster_config, engine_actor  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]
PREFIX = "rtserve-test-engine"
SLOTS = 2


def front_end(
    cluster: Cluster, worker_index: int = 0, apps: list[web.Application] | None = None
) -> contextlib.AbstractAsyncContextManager[tuple[str, ClusterEngines]]:
    config = cluster_config(cluster.address, engine="loopback", prefix=PREFIX)
    config.lockstep.batch_size = SLOTS
    config.sessions.disconnect_grace_s = 0.2
    config.sessions.reaper_interval_s = 0.05
    return ray_support.front_end(config, worker_index, apps)


def _sessions(engines: ClusterEngines) -> list[int | None]:
    return [state["sessions"] for state in engines.placement().values()]


def _actor(index: int):
    return engine_actor(PREFIX, index)


async def test_one_engine_actor_per_node_and_admission_across_them(ray_cluster: Cluster) -> None:
    async with front_end(ray_cluster) as (base, engines), aiohttp.ClientSession() as http:
        placed = await asyncio.gather(*(_actor(i).placement.remote() for i in range(2)))
        nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        assert {p["node_id"] for p in placed} == nodes and len(nodes) == 2
        clients = [await open_session(http, base) for _ in range(2)]
        assert all(c.admitted for c in clients) and _sessions(engines) == [1, 1]
        clients += [await open_session(http, base) for _ in range(2)]
        assert all(c.admitted for c in clients) and _sessions(engines) == [2, 2]
        refused = await open_session(http, base)
        assert refused.first["error"]["code"] == "resource_exhausted"
        for client in clients:
            assert await echoes_again(client)
        async with http.get(f"{base}/metrics") as response:
            text = await response.text()
        for index in range(2):
            assert f'rtserve_lockstep_live_slots{{engine="{PREFIX}-{index}"}} 2.0' in text
        for client in clients:
            await client.close()


async def test_rtserve_serve_with_a_ray_address_runs_workers_against_the_engine_actors(ray_cluster: Cluster) -> None:
    """The CLI path: ``--ray-address`` with two front-end workers and no local engine process;
    the detached actors outlive the front-end."""
    port = _free_port()
    env = {
        **CLEAN_ENV,
        "PYTHONPATH": os.getcwd(),
        "RTSERVE_LOCKSTEP__BATCH_SIZE": str(SLOTS),
        "RTSERVE_CLUSTER__NAMESPACE": NAMESPACE,
        "RTSERVE_CLUSTER__ENGINE_PREFIX": PREFIX,
        "RTSERVE_CLUSTER__ENGINES": "2",
        "RTSERVE_CLUSTER__ENGINE_RESOURCES": "{rtserve_engine: 1}",
        "RTSERVE_CLUSTER__PLACEMENT_STRATEGY": "STRICT_SPREAD",
        "RTSERVE_CLUSTER__ENGINE_HOST": "127.0.0.1",
        "RTSERVE_CLUSTER__SECRET": SECRET,
        "RTSERVE_PEERS__HOST": "127.0.0.1",
    }
    pids_before = [(await _actor(i).placement.remote())["pid"] for i in range(2)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rtserve.cli",
        "serve",
        "--engine",
        "loopback",
        "--port",
        str(port),
        "--workers",
        "2",
        "--ray-address",
        ray_cluster.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def healthy() -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{base}/health") as response:
                        return response.status == 200
                return False

            for _ in range(600):
                if await healthy():
                    break
                assert proc.returncode is None, (await proc.stdout.read()).decode()
                await asyncio.sleep(0.2)
            # Both workers publish the port they share, so each one's /health asks the other. The
            # first worker up answers /health before the second has joined the cluster (it then
            # answers for itself alone, as no other is serving yet): wait for the second.
            directory = ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
            for _ in range(300):
                publics = [entry["public"] for entry in (await directory.front_ends.remote()).values()]
                if sum(public is not None and public.endswith(f":{port}") for public in publics) == 2:
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"both workers should publish the port they share: {publics}")
            client = await open_session(http, base)
            assert client.admitted and client.ws._response.headers["X-Rtserve-Worker"]
            assert await echoes_again(client)
            async with http.get(f"{base}/metrics") as response:
                assert f'engine="{PREFIX}-0"' in await response.text()
            await client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert [(await _actor(i).placement.remote())["pid"] for i in range(2)] == pids_before


async def test_the_front_ends_of_one_host_and_port_are_each_others_neighbours(ray_cluster: Cluster) -> None:
    config = cluster_config(ray_cluster.address, engine="loopback", prefix=PREFIX)
    handle = await asyncio.to_thread(directory_actor, config)
    directories = {  # two workers of one port, a server on another port, one that names no port
        "0000aaa1": RayDirectory(handle, "127.0.0.1", 18123),
        "0000aaa2": RayDirectory(handle, "127.0.0.1", 18123),
        "0000aaa3": RayDirectory(handle, "127.0.0.1", 18124),
        "0000aaa4": RayDirectory(handle, "127.0.0.1"),
    }
    runners: list[web.AppRunner] = []
    try:
        for tag, directory in directories.items():
            runner = web.AppRunner(web.Application())
            await runner.setup()
            await directory.site(runner, tag).start()
            runners.append(runner)
            await directory.publish(tag, runner)
        neighbours = await directories["0000aaa1"].neighbours("0000aaa1")
        assert list(neighbours) == ["0000aaa2"] and neighbours["0000aaa2"].port == runners[1].addresses[0][1]
        assert list(await directories["0000aaa2"].neighbours("0000aaa2")) == ["0000aaa1"]
        assert await directories["0000aaa3"].neighbours("0000aaa3") == {}
        assert await directories["0000aaa4"].neighbours("0000aaa4") == {}
    finally:
        for tag, directory in directories.items():
            await directory.withdraw(tag)
        for runner in runners:
            await runner.cleanup()


async def test_a_resume_through_another_front_end_reaches_the_same_engine_slot(ray_cluster: Cluster) -> None:
    """Front-ends A and B (as if on two hosts: TCP peers, signed requests, the Ray directory)."""
    apps: list[web.Application] = []
    async with (
        front_end(ray_cluster, 0, apps) as (a, a_engines),
        front_end(ray_cluster, 1, apps) as (b, _),
        aiohttp.ClientSession() as http,
    ):
        await eventually(lambda: _sessions(a_engines) == [0, 0], what="earlier sessions to be gone")
        directory = ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
        published = await directory.front_ends.remote()
        assert {app[CTX].sessions.owner for app in apps} <= set(published)

        def b_socket(_first: aiohttp.ClientWebSocketResponse):
            return http.ws_connect(ws_url(b, duplex="1", autostart="0"))

        result = await drop_and_resume(http, a, b_socket)
        assert result.resumed["type"] == "session.resumed", result.resumed
        assert echoed_tags(result.replayed)[-3:] == [11, 12, 13] and echoed_tags(result.flowing)[-1] == 21
        # Admitted once, on A, and never reopened: the echo after the resume is A's engine session's.
        assert [app[CTX].sessions.metrics.opened._value.get() for app in apps] == [1, 0]
        async with aiohttp.ClientSession() as stranger:  # the peer site serves only signed requests
            entry = published[apps[0][CTX].sessions.owner]
            async with stranger.get(f"http://{entry['host']}:{entry['port']}/v1/realtime") as response:
                assert response.status == 403


async def test_rtserve_drain_of_a_front_end_stops_its_admission_and_it_leaves_when_its_sessions_end(
    ray_cluster: Cluster,
) -> None:
    apps: list[web.Application] = []
    async with aiohttp.ClientSession() as http:
        async with front_end(ray_cluster, 0, apps) as (base, _):
            kept = await open_session(http, base)
            tag = apps[0][CTX].sessions.owner
            assert tag is not None
            drain = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "rtserve.cli",
                "drain",
                "--ray-address",
                ray_cluster.address,
                "--namespace",
                NAMESPACE,
                "--front-end",
                tag,
                "--deadline",
                "120",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**CLEAN_ENV, "PYTHONPATH": os.getcwd(), "RTSERVE_CLUSTER__SECRET": SECRET},
            )
            await eventually(lambda: apps[0][CTX].sessions.draining, 60, "the drain to arrive")
            refused = await open_session(http, base)
            assert refused.first["error"]["code"] == "server_shutting_down"
            assert await echoes_again(kept) and not kept.errors
            await kept.close()
            await eventually(apps[0][CTX].stop.is_set, 30, "the front-end to stop after its last session")
        # The serve loop stopped (here: the context's cleanup): it withdrew, so the drain is done.
        output, _ = await asyncio.wait_for(drain.communicate(), 60)
        assert drain.returncode == 0, output.decode()
        assert "left the cluster" in output.decode()


async def test_a_killed_engine_actor_ends_only_its_sessions_and_ray_brings_it_back(ray_cluster: Cluster) -> None:
    async with front_end(ray_cluster) as (base, engines), aiohttp.ClientSession() as http:
        await eventually(lambda: _sessions(engines) == [0, 0], what="earlier sessions to be gone")
        on_0, on_1 = await open_session(http, base), await open_session(http, base)
        assert _sessions(engines) == [1, 1]
        doomed = await _actor(1).placement.remote()
        os.kill(doomed["pid"], signal.SIGKILL)
        await eventually(lambda: bool(on_1.errors), what="engine_failure on the killed engine's session")
        assert [e["code"] for e in on_1.errors] == ["engine_failure"]
        assert await echoes_again(on_0) and not on_0.errors
        await eventually(lambda: engines.members[1].serving, 90, "Ray to restart the engine actor")
        restarted = await _actor(1).placement.remote()
        assert restarted["pid"] != doomed["pid"] and restarted["address"] != doomed["address"]
        newcomer = await open_session(http, base)  # the restarted engine is the emptier one
        assert newcomer.admitted and _sessions(engines) == [1, 1]
        assert await echoes_again(newcomer)
        for client in (on_0, on_1, newcomer):
            await client.close()


async def test_rtserve_drain_moves_new_sessions_away_and_the_engine_leaves_at_its_deadline(
    ray_cluster: Cluster,
) -> None:
    async with front_end(ray_cluster) as (base, engines), aiohttp.ClientSession() as http:
        await eventually(lambda: _sessions(engines) == [0, 0], what="earlier sessions to be gone")
        on_0, on_1 = await open_session(http, base), await open_session(http, base)
        drain = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rtserve.cli",
            "drain",
            "--ray-address",
            ray_cluster.address,
            "--namespace",
            NAMESPACE,
            "--engine",
            f"{PREFIX}-1",
            "--deadline",
            "4",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**CLEAN_ENV, "PYTHONPATH": os.getcwd()},
        )
        await eventually(lambda: engines.placement()[f"{PREFIX}-1"]["draining"], 60, "the drain to be seen")
        newcomer = await open_session(http, base)
        assert newcomer.admitted and _sessions(engines) == [2, 1]
        assert await echoes_again(on_1) and not on_1.errors  # its own session goes on until the deadline
        output, _ = await asyncio.wait_for(drain.communicate(), 90)
        assert drain.returncode == 0, output.decode()
        assert "left the cluster" in output.decode()
        assert [e["code"] for e in on_1.errors] == ["engine_failure"]  # cut at the deadline
        with pytest.raises(ValueError):
            _actor(1)
        assert await echoes_again(on_0) and not on_0.errors
        for client in (on_0, on_1, newcomer):
            await client.close()
