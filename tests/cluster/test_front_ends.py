"""Two front-ends over the same two engines (TCP link, no Ray), peers over a socket folder.

A session lives in the front-end that admitted it; a resume that lands on the other one is
relayed to the owner (``web/peers``): ``session.resumed``, the journal replayed, audio from
the same engine slot. A front-end drained through its peer socket admits nothing new, keeps
its sessions, and stops once they end or at its deadline.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.app import build_app
from rtserve.cluster.engines import ClusterEngines
from rtserve.config import ServerConfig
from rtserve.web.context import CTX
from rtserve.web.peers import Peers, SocketDirectory, new_front_end_tag
from rtserve.web.peers.site import DRAIN_ROUTE
from tests.cluster.clients import drop_and_resume, echoes_again, eventually, open_session
from tests.cluster.engines import connect_to, tcp_engines
from tests.support import serve_app
from tests.web.realtime_support import echoed_tags, pcm16_b64, read_until, receive_event, tagged_frame, ws_url

SLOTS = 2


@dataclass
class FrontEnd:
    base: str
    app: web.Application
    cluster: ClusterEngines
    peers: Peers

    @property
    def sessions(self):
        return self.app[CTX].sessions

    def placement(self) -> list[int]:
        return [state["sessions"] for state in self.cluster.placement().values()]


@contextlib.asynccontextmanager
async def two_front_ends(config: ServerConfig) -> AsyncIterator[tuple[FrontEnd, FrontEnd]]:
    config.sessions.reaper_interval_s = 0.05
    config.engine = "loopback"
    config.lockstep.batch_size = SLOTS
    folder = tempfile.mkdtemp(prefix="rtpeers-")  # short: a Unix socket path has ~100 bytes
    try:
        async with tcp_engines(config, 2) as engines, contextlib.AsyncExitStack() as stack:
            front_ends = []
            for index in range(2):
                registry = CollectorRegistry()
                links = ClusterEngines.links(
                    [(f"engine-{i}", connect_to(e)) for i, e in enumerate(engines)],
                    config.engine_link,
                    worker_index=index,
                    registry=registry,
                )
                cluster = await ClusterEngines.connect(links, config.engine_link, startup_timeout_s=30)
                peers = Peers(new_front_end_tag(), SocketDirectory(folder), config.peers)
                app = build_app(config, engines=cluster, registry=registry, peers=peers)
                base = await stack.enter_async_context(serve_app(app))

                def ready(cluster: ClusterEngines = cluster) -> bool:
                    return cluster.ready

                await eventually(ready, what="the engines to be ready")
                front_ends.append(FrontEnd(base, app, cluster, peers))
            yield front_ends[0], front_ends[1]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_resume_through_the_other_front_end_reaches_the_session_where_it_lives(config: ServerConfig) -> None:
    async with two_front_ends(config) as (a, b), aiohttp.ClientSession() as http:
        result = await drop_and_resume(
            http, a.base, lambda _: http.ws_connect(ws_url(b.base, duplex="1", autostart="0"))
        )
        assert result.resumed["type"] == "session.resumed", result.resumed
        assert result.resumed["session_id"] == result.created["session"]["id"]
        assert result.resumed["attachment_generation"] == 1
        seqs = [e["server_event_seq"] for e in result.replayed + result.flowing]
        assert seqs == list(range(result.last_seq + 1, result.last_seq + 1 + len(seqs)))  # journal, then live: no gap
        assert echoed_tags(result.replayed)[-3:] == [11, 12, 13] and echoed_tags(result.flowing)[-1] == 21
        # One session, one engine slot, never reopened: B admitted nothing, the engine still counts one.
        assert result.created["session"]["id"].split("-")[1] == a.peers.tag
        assert b.sessions.metrics.opened._value.get() == 0 and a.sessions.metrics.opened._value.get() == 1
        await eventually(lambda: a.sessions.active_count() == 0, what="the closed session to be released")
        metrics = await _metrics(http, b)
        assert 'rtserve_peer_relays_total{outcome="relayed"} 1.0' in metrics
        assert "rtserve_peer_relayed_sockets 0.0" in metrics  # the relay ended with the socket


async def test_a_refused_relayed_resume_leaves_the_socket_here_and_unknown_owners_answer_alike(
    config: ServerConfig,
) -> None:
    async with two_front_ends(config) as (a, b), aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(a.base, duplex="1")) as owner_socket:
            created = await receive_event(owner_socket)
            assert created is not None
            session_id = created["session"]["id"]
            async with http.ws_connect(ws_url(b.base, duplex="1", autostart="0")) as elsewhere:
                await elsewhere.send_json(
                    {
                        "type": "session.resume",
                        "session_id": session_id,
                        "resume_token": "not-the-token",
                        "attachment_generation": 0,
                    }
                )
                wrong_token = await receive_event(elsewhere)
                assert wrong_token is not None
                nobody = session_id.replace(a.peers.tag, "0badf00d" if a.peers.tag != "0badf00d" else "0badf00e")
                await elsewhere.send_json(
                    {
                        "type": "session.resume",
                        "session_id": nobody,
                        "resume_token": created["resume_token"],
                        "attachment_generation": 0,
                    }
                )
                unknown_owner = await receive_event(elsewhere)
                assert unknown_owner is not None
                await elsewhere.send_json(
                    {
                        "type": "session.resume",
                        "session_id": session_id,
                        "resume_token": created["resume_token"],
                        "attachment_generation": 0,
                    }
                )
                resumed = await receive_event(elsewhere)  # the same socket, now with the right token
                assert resumed is not None
            assert resumed["type"] == "session.resumed"
            assert (await read_until(owner_socket, "session.replaced"))[-1]["attachment_generation"] == 1
        metrics = await _metrics(http, b)
    for outcome in ("refused", "no_owner", "relayed"):
        assert f'rtserve_peer_relays_total{{outcome="{outcome}"}} 1.0' in metrics
    for refusal in (wrong_token, unknown_owner):
        assert refusal["type"] == "error" and refusal["error"]["code"] == "unknown_session"
    assert wrong_token["error"]["message"] == unknown_owner["error"]["message"]  # no oracle for guessed ids


async def _metrics(http: aiohttp.ClientSession, front_end: FrontEnd) -> str:
    async with http.get(f"{front_end.base}/metrics") as response:
        return await response.text()


async def _drain(http: aiohttp.ClientSession, front_end: FrontEnd, **body: float) -> dict:
    directory = front_end.peers.directory
    assert isinstance(directory, SocketDirectory)
    path = SocketDirectory(directory.folder)
    address = await path.lookup(front_end.peers.tag)
    assert address is not None and address.path is not None  # a Unix socket directory
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(address.path)) as peer:
        async with peer.post(address.base_url + DRAIN_ROUTE, json=body) as response:
            assert response.status == 202
            return await response.json()


async def test_a_drained_front_end_admits_nothing_keeps_its_sessions_and_stops_when_they_end(
    config: ServerConfig,
) -> None:
    config.sessions.disconnect_grace_s = 0.2  # a client that left is not waited for long
    async with two_front_ends(config) as (a, b), aiohttp.ClientSession() as http:
        kept = await open_session(http, a.base)
        assert kept.admitted
        answer = await _drain(http, a, deadline_s=600)
        assert answer == {"status": "draining", "sessions": 1, "deadline_s": 600}
        async with http.get(f"{a.base}/health") as health:
            assert health.status == 503 and (await health.json())["status"] == "draining"
        refused = await open_session(http, a.base)
        assert refused.first["type"] == "error" and refused.first["error"]["code"] == "server_shutting_down"
        elsewhere = await open_session(http, b.base)  # the other front-end still admits
        assert elsewhere.admitted
        assert await echoes_again(kept) and not kept.errors
        assert not a.app[CTX].stop.is_set()
        await kept.close()
        await eventually(a.app[CTX].stop.is_set, what="the drained front-end to stop after its last session")
        assert not b.app[CTX].stop.is_set()
        await elsewhere.close()


async def test_a_drained_front_end_stops_at_its_deadline_with_sessions_still_open(config: ServerConfig) -> None:
    async with two_front_ends(config) as (a, _), aiohttp.ClientSession() as http:
        kept = await open_session(http, a.base)
        await _drain(http, a, deadline_s=0.3)
        await eventually(a.app[CTX].stop.is_set, what="the drain deadline")
        assert a.sessions.active_count() == 1  # the serve loop now stops: shutdown closes it
        await kept.close()


async def test_a_socket_whose_url_names_another_front_ends_session_is_relayed_there_whole(config: ServerConfig) -> None:
    """``?session_id=`` (the resume query parameters): the socket is the owner's from its first frame."""
    async with two_front_ends(config) as (a, b), aiohttp.ClientSession() as http:
        async with (
            http.ws_connect(ws_url(a.base, duplex="1")) as on_a,
            http.ws_connect(ws_url(b.base, duplex="1")) as on_b,
        ):
            created_a, created_b = await receive_event(on_a), await receive_event(on_b)
            assert created_a is not None and created_b is not None
            url = ws_url(b.base, duplex="1", autostart="0", session_id=created_a["session"]["id"])
            async with http.ws_connect(url) as relayed:
                # B's own session is not reachable on this socket: every frame goes to A.
                await relayed.send_json(
                    {
                        "type": "session.resume",
                        "session_id": created_b["session"]["id"],
                        "resume_token": created_b["resume_token"],
                        "attachment_generation": 0,
                    }
                )
                not_here = await receive_event(relayed)
                assert not_here is not None
                await relayed.send_json(
                    {
                        "type": "session.resume",
                        "session_id": created_a["session"]["id"],
                        "resume_token": created_a["resume_token"],
                        "attachment_generation": 0,
                    }
                )
                resumed = await receive_event(relayed)
                assert resumed is not None
                await relayed.send_json({"type": "input_audio_buffer.append", "audio": pcm16_b64(tagged_frame(31))})
                await read_until(relayed, lambda e: 31 in echoed_tags([e]))
    assert not_here["type"] == "error" and not_here["error"]["code"] == "unknown_session"
    assert resumed["type"] == "session.resumed" and resumed["session_id"] == created_a["session"]["id"]
