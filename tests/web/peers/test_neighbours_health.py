"""Front-ends sharing one address (a host's workers on one port): ``/health`` on any of them is
200 only once every one serves, since the kernel hands the next connection to any of them.

Two front-ends over real sockets, peers over a socket folder, each with an engine that loads
until the test lets it: the ready one answers 503 naming the other until that one is ready too;
a socket left behind by a worker that died does not hold the address back; a neighbour that
does not answer within ``peers.health_timeout_s`` is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.web.peers import PeerAddress, Peers, SocketDirectory, new_front_end_tag
from rtserve.web.peers.site import DRAIN_ROUTE
from tests.support import serve_app
from tests.web.test_base_routes import GatedStartEngine, _health


@contextlib.asynccontextmanager
async def _front_ends(
    config: ServerConfig, count: int, directory: type[SocketDirectory] = SocketDirectory
) -> AsyncIterator[tuple[str, list[tuple[str, Peers, GatedStartEngine]]]]:
    folder = tempfile.mkdtemp(prefix="rthealth-")  # short: a Unix socket path has ~100 bytes
    try:
        async with contextlib.AsyncExitStack() as stack:
            front_ends = []
            for _ in range(count):
                engine = GatedStartEngine()
                peers = Peers(new_front_end_tag(), directory(folder), config.peers)
                base = await stack.enter_async_context(serve_app(build_app(config, engine=engine, peers=peers)))
                front_ends.append((base, peers, engine))
            yield folder, front_ends
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _until(http: aiohttp.ClientSession, base: str, status: int) -> dict:
    deadline = time.monotonic() + 10
    while (answer := await _health(http, base))[0] != status:
        assert time.monotonic() < deadline, f"/health stayed {answer}"
        await asyncio.sleep(0.02)
    return answer[1]


async def _until_ready(engine: GatedStartEngine) -> None:
    for _ in range(500):
        if engine.ready:
            return
        await asyncio.sleep(0.01)
    pytest.fail("the engine never became ready")


async def test_health_is_503_naming_a_neighbour_until_every_front_end_serves(config: ServerConfig) -> None:
    async with (
        _front_ends(config, 2) as (_, [(a, _, engine_a), (b, peers_b, engine_b)]),
        aiohttp.ClientSession() as http,
    ):
        assert (await _health(http, a))[0] == 503  # neither is ready
        engine_a.gate.set()
        await _until_ready(engine_a)
        for _ in range(3):  # A serves itself, B does not yet
            status, body = await _health(http, a)
            assert status == 503 and body["status"] == "starting" and body["front_end"] == peers_b.tag, body
        assert await _health(http, b) == (503, {"status": "starting"})  # B speaks of itself: it is the one
        engine_b.gate.set()
        assert await _until(http, a, 200) == {"status": "ok"}
        assert await _until(http, b, 200) == {"status": "ok"}


async def test_sockets_of_no_serving_front_end_neither_hold_the_address_back_nor_stall_it(
    config: ServerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    async with _front_ends(config, 1) as (folder, [(a, _, engine)]), aiohttp.ClientSession() as http:
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(f"{folder}/deadbeef.sock")  # bound, never listening, then closed: what a killed worker leaves
        dead.close()
        engine_link = socket.socket(socket.AF_UNIX)
        engine_link.bind(f"{folder}/engine.sock")  # the engine link's socket shares the folder: not a front-end
        engine_link.listen(8)  # a connection would wait for an answer that never comes
        engine.gate.set()
        try:
            assert await _until(http, a, 200) == {"status": "ok"}
        finally:
            engine_link.close()
    assert not [r.getMessage() for r in caplog.records if "health check" in r.getMessage()]  # nobody was waited for


async def test_a_neighbour_that_does_not_answer_in_time_is_left_out(
    config: ServerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    config.peers.health_timeout_s = 0.2
    async with _front_ends(config, 1) as (folder, [(a, _, engine)]), aiohttp.ClientSession() as http:
        stalled = socket.socket(socket.AF_UNIX)
        stalled.bind(f"{folder}/0badcafe.sock")
        stalled.listen(8)  # connections queue; nobody ever answers
        try:
            engine.gate.set()
            started = time.monotonic()
            assert await _until(http, a, 200) == {"status": "ok"}
            assert time.monotonic() - started < 5
        finally:
            stalled.close()
    assert any("0badcafe did not answer a health check" in r.getMessage() for r in caplog.records)


async def test_a_draining_neighbour_leaves_the_address_in_rotation(config: ServerConfig) -> None:
    async with (
        _front_ends(config, 2) as (folder, [(a, _, engine_a), (b, peers_b, engine_b)]),
        aiohttp.ClientSession() as http,
    ):
        engine_a.gate.set()
        engine_b.gate.set()
        await _until(http, a, 200)
        drain = aiohttp.UnixConnector(f"{folder}/{peers_b.tag}.sock")
        async with aiohttp.ClientSession(connector=drain) as peer, peer.post(f"http://peer{DRAIN_ROUTE}") as resp:
            assert resp.status == 202
        assert (await _health(http, b))[1] == {"status": "draining"}  # B says so itself...
        assert await _until(http, a, 200) == {"status": "ok"}  # ...and the others serve its share


class _UnreachableDirectory(SocketDirectory):
    """A cluster directory whose actor is gone: listing the neighbours fails."""

    async def neighbours(self, tag: str) -> dict[str, PeerAddress]:
        raise ConnectionError("the directory actor is gone")


async def test_a_directory_that_cannot_list_the_neighbours_leaves_each_front_end_answering_for_itself(
    config: ServerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        _front_ends(config, 1, _UnreachableDirectory) as (_, [(a, _, engine)]),
        aiohttp.ClientSession() as http,
    ):
        engine.gate.set()
        assert await _until(http, a, 200) == {"status": "ok"}  # not a 500
    assert any("did not list the neighbours" in r.getMessage() for r in caplog.records)
