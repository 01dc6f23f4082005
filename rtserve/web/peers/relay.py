"""Relaying a client's socket to the front-end that owns its session.

The receiving front-end opens a WebSocket to the owner's peer site on the client's own path
and query (so the owner chooses the same dialect), then copies frames both ways until either
side closes. Backpressure carries through: a client that reads slowly stops this relay
reading the owner, whose own sender then waits and whose output buffer applies its policy.

Two entry points:
* ``relay_resume``: a ``session.resume`` arrived on a socket without a session; the frame goes
  to the owner and the owner's first answer decides. ``session.resumed``: the socket is
  relayed for its life. An ``error`` (wrong token, say): it is passed on and the socket stays
  here, sessionless, exactly as a local refusal leaves it.
* ``relay_socket``: the URL itself names another front-end's session (``?session_id=``); the
  whole socket is relayed from its first frame.

An owner that is not in the directory, or does not answer, is treated as gone: the caller
answers locally (``unknown_session``), the same answer a guessed id gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Counter, Gauge

from rtserve.config import PeersConfig
from rtserve.web.connections import close_socket
from rtserve.web.peers import signing
from rtserve.web.peers.directory import Directory, PeerAddress
from rtserve.web.peers.owner import owner_of
from rtserve.web.peers.signing import PeerSigner
from rtserve.web.subprotocols import is_key_subprotocol, offered_subprotocols

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Origin:
    """What the owner must see of the client's request to serve it the same way: the path and
    query, the offered subprotocols and the beta header (what the dialect choice reads). Not
    the API key in any form: this front-end checked it, and it need not travel further."""

    path_qs: str
    protocols: tuple[str, ...]
    headers: Mapping[str, str]

    @classmethod
    def of(cls, request: web.Request) -> Origin:
        protocols = tuple(p for p in offered_subprotocols(request) if not is_key_subprotocol(p))
        headers = {name: request.headers[name] for name in ("OpenAI-Beta",) if name in request.headers}
        return cls(request.rel_url.without_query_params("api_key").path_qs, protocols, headers)


class RelayOutcome(enum.Enum):
    NO_OWNER = enum.auto()  # not another front-end's session, or its owner is gone: answer here
    REFUSED = enum.auto()  # the owner refused the resume; its error was passed on
    RELAYED = enum.auto()  # the socket was relayed until it closed


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.relays = Counter(
            "rtserve_peer_relays",
            "Sockets for another front-end's session, by outcome (relayed, refused by the owner, owner gone)",
            ["outcome"],
            registry=registry,
        )
        self.open = Gauge(
            "rtserve_peer_relayed_sockets", "Client sockets relayed to their session's owner now", registry=registry
        )


class Peers:
    """This front-end (``tag``) among the others of its ``directory``."""

    def __init__(
        self, tag: str, directory: Directory, settings: PeersConfig, *, signer: PeerSigner | None = None
    ) -> None:
        self.tag = tag
        self.directory = directory
        self.settings = settings
        self.signer = signer  # TCP peers sign their requests; Unix-socket peers need not
        self.heartbeat_s: float | None = None
        self.metrics = RelayMetrics(CollectorRegistry())

    def serve_app(self, registry: CollectorRegistry, heartbeat_s: float | None) -> None:
        """Count into the app's registry; ping relayed sockets as the app pings its own."""
        self.metrics = RelayMetrics(registry)
        self.heartbeat_s = heartbeat_s

    def remote_owner(self, session_id: str | None) -> str | None:
        owner = owner_of(session_id)
        return owner if owner is not None and owner != self.tag else None

    async def relay_resume(self, ws: web.WebSocketResponse, first: str, owner: str, origin: Origin) -> RelayOutcome:
        outcome = await self._relay_resume(ws, first, owner, origin)
        self.metrics.relays.labels(outcome.name.lower()).inc()
        return outcome

    async def _relay_resume(self, ws: web.WebSocketResponse, first: str, owner: str, origin: Origin) -> RelayOutcome:
        upstream = await self._connect(owner, origin)
        if upstream is None:
            return RelayOutcome.NO_OWNER
        async with upstream:
            try:
                await upstream.ws.send_str(first)
                answer = await upstream.ws.receive(timeout=self.settings.connect_timeout_s)
            except (aiohttp.ClientError, ConnectionError, TimeoutError):
                log.warning("front-end %s did not answer a relayed resume", owner)
                return RelayOutcome.NO_OWNER
            if answer.type is not WSMsgType.TEXT:
                return RelayOutcome.NO_OWNER
            await ws.send_str(answer.data)
            if json.loads(answer.data).get("type") != "session.resumed":
                return RelayOutcome.REFUSED
            log.info("session resumed through this front-end; relaying to its owner %s", owner)
            await self._copy(ws, upstream)
        return RelayOutcome.RELAYED

    async def relay_socket(self, ws: web.WebSocketResponse, owner: str, origin: Origin) -> bool:
        """False (nothing sent) when the owner cannot be reached."""
        upstream = await self._connect(owner, origin)
        if upstream is None:
            self.metrics.relays.labels(RelayOutcome.NO_OWNER.name.lower()).inc()
            return False
        self.metrics.relays.labels(RelayOutcome.RELAYED.name.lower()).inc()
        async with upstream:
            log.info("socket for a session of front-end %s; relaying it there", owner)
            await self._copy(ws, upstream)
        return True

    async def _copy(self, ws: web.WebSocketResponse, upstream: _Upstream) -> None:
        with self.metrics.open.track_inprogress():
            await _copy_both_ways(ws, upstream.ws)

    async def _connect(self, owner: str, origin: Origin) -> _Upstream | None:
        try:
            address = await asyncio.wait_for(self.directory.lookup(owner), self.settings.connect_timeout_s)
        except Exception:  # the directory itself unreachable: as if the owner were gone
            log.warning("front-end directory lookup of %s failed", owner, exc_info=True)
            return None
        if address is None:
            return None
        upstream = _Upstream(address)
        headers = dict(origin.headers)
        if self.signer is not None:
            headers[signing.HEADER] = self.signer.sign("GET", origin.path_qs)
        timeout_s = self.settings.connect_timeout_s
        try:
            upstream.ws = await asyncio.wait_for(
                upstream.http.ws_connect(
                    address.base_url + origin.path_qs,
                    headers=headers,
                    protocols=origin.protocols,
                    autoping=True,
                    heartbeat=self.heartbeat_s,
                    timeout=aiohttp.ClientWSTimeout(ws_close=timeout_s),
                    max_msg_size=0,
                    compress=0,
                ),
                timeout_s,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("front-end %s at %s is not reachable: %s", owner, address, exc)
            await upstream.http.close()
            return None
        return upstream


class _Upstream:
    """One relay's client session and socket to the owner."""

    def __init__(self, address: PeerAddress) -> None:
        connector = aiohttp.UnixConnector(address.path) if address.path is not None else aiohttp.TCPConnector()
        self.http = aiohttp.ClientSession(connector=connector)
        self.ws: aiohttp.ClientWebSocketResponse

    async def __aenter__(self) -> _Upstream:
        return self

    async def __aexit__(self, *_: object) -> None:
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            await self.ws.close()
        await self.http.close()


async def _pass_on(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> aiohttp.WSMessage:
    """Copies data frames until another kind arrives (close, error); returns that one."""
    while True:
        message = await source.receive()
        if message.type is WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type is WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            return message


async def _copy_both_ways(client: web.WebSocketResponse, owner: aiohttp.ClientWebSocketResponse) -> None:
    """Until either side closes; the other is then closed with the same code."""

    async def downward() -> None:
        ended = await _pass_on(owner, client)
        await close_socket(
            client, owner.close_code or aiohttp.WSCloseCode.OK, ended.extra if isinstance(ended.extra, str) else ""
        )

    # Upward: the client left (or broke the protocol); closing the owner's socket below detaches there.
    tasks = [asyncio.ensure_future(_pass_on(client, owner)), asyncio.ensure_future(downward())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            await owner.close()
