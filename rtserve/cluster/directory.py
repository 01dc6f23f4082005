"""The cluster's directory of front-ends: a named, detached Ray actor.

Each front-end publishes where it serves its peers (TCP, signed requests: ``web/peers``) and
withdraws when it stops; a front-end relaying a resume looks the owner up by the tag in the
session id, and ``rtserve drain --front-end`` finds front-ends by tag or host. Only
addresses live here, never sessions: a front-end that died without withdrawing is simply not
answering, which the relay treats as the owner being gone. Ray restarts the actor empty
after a crash; front-ends publish again when they start, so until then their older sessions
resume only on them directly.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import ray
from aiohttp import web

from rtserve.config import ServerConfig
from rtserve.web.peers import PeerAddress, Peers, new_front_end_tag
from rtserve.web.peers.signing import PeerSigner


class FrontEndDirectoryActor:
    def __init__(self) -> None:
        self._front_ends: dict[str, dict[str, Any]] = {}

    def publish(self, tag: str, entry: dict[str, Any]) -> None:
        self._front_ends[tag] = entry

    def withdraw(self, tag: str) -> None:
        self._front_ends.pop(tag, None)

    def lookup(self, tag: str) -> dict[str, Any] | None:
        return self._front_ends.get(tag)

    def front_ends(self) -> dict[str, dict[str, Any]]:
        return dict(self._front_ends)


DIRECTORY_NAME = "rtserve-front-ends"  # one per Ray namespace


def directory_actor(config: ServerConfig) -> Any:
    """The directory's handle, created by the first front-end. Needs ``ray.init``."""
    return (
        ray.remote(FrontEndDirectoryActor)
        .options(
            name=DIRECTORY_NAME,
            namespace=config.cluster.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,
        )
        .remote()
    )


class RayDirectory:
    """``web/peers.Directory`` over the directory actor. ``public_port``: the port this front-end
    serves clients on, which the workers of one host share (``--workers N``); None: its own."""

    def __init__(self, handle: Any, host: str, public_port: int | None = None) -> None:
        self._handle = handle
        self._host = host
        self._public = None if public_port is None else f"{socket.gethostname()}:{public_port}"

    def site(self, runner: web.AppRunner, tag: str) -> web.BaseSite:
        return web.TCPSite(runner, self._host, 0)

    async def publish(self, tag: str, runner: web.AppRunner) -> None:
        host, port = runner.addresses[0][:2]
        await self._handle.publish.remote(
            tag,
            {"host": host, "port": port, "hostname": socket.gethostname(), "pid": os.getpid(), "public": self._public},
        )

    async def withdraw(self, tag: str) -> None:
        await self._handle.withdraw.remote(tag)

    async def lookup(self, tag: str) -> PeerAddress | None:
        entry = await self._handle.lookup.remote(tag)
        return None if entry is None else PeerAddress(host=entry["host"], port=entry["port"])

    async def neighbours(self, tag: str) -> dict[str, PeerAddress]:
        """The front-ends that published the same host and public port (a host's workers)."""
        if self._public is None:
            return {}
        entries = await self._handle.front_ends.remote()
        return {
            other: PeerAddress(host=entry["host"], port=entry["port"])
            for other, entry in entries.items()
            if other != tag and entry.get("public") == self._public
        }


def peer_signer(config: ServerConfig) -> PeerSigner:
    assert config.cluster.secret is not None
    return PeerSigner(
        config.cluster.secret.encode(),
        max_clock_skew_s=config.peers.max_clock_skew_s,
        max_remembered=config.peers.max_remembered_nonces,
    )


async def cluster_peers(config: ServerConfig, public_port: int | None = None) -> Peers:
    """This front-end's place among the cluster's (after ``join_cluster``); ``public_port``: as
    ``RayDirectory`` takes it."""
    handle = await asyncio.to_thread(directory_actor, config)
    host = config.peers.host or ray.util.get_node_ip_address()
    directory = RayDirectory(handle, host, public_port)
    return Peers(new_front_end_tag(), directory, config.peers, signer=peer_signer(config))
