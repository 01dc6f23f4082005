"""Where each front-end serves its peers, by tag.

On one host (``--workers N``) the directory is the supervisor's private folder (0700): a
front-end's peer socket is ``FOLDER/TAG.sock``, so binding it is registering and a front-end
that died leaves a path nobody answers. A cluster's directory is a Ray actor
(``cluster/directory.py``) that front-ends publish their TCP address to.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from rtserve.web.peers.owner import is_front_end_tag


@dataclass(frozen=True)
class PeerAddress:
    """A Unix socket path, or a TCP host and port."""

    path: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def base_url(self) -> str:
        return "http://peer" if self.path is not None else f"http://{self.host}:{self.port}"


class Directory(Protocol):
    def site(self, runner: web.AppRunner, tag: str) -> web.BaseSite:
        """The private site this front-end serves its peers on (not started)."""
        ...

    async def publish(self, tag: str, runner: web.AppRunner) -> None:
        """Tell the peers where ``runner``'s started site is."""
        ...

    async def withdraw(self, tag: str) -> None: ...

    async def lookup(self, tag: str) -> PeerAddress | None:
        """Where the front-end ``tag`` is reached; None when it is not (or no longer) there."""
        ...

    async def neighbours(self, tag: str) -> dict[str, PeerAddress]:
        """The other front-ends that serve ``tag``'s public address (its ``/health`` speaks for them too)."""
        ...


class SocketDirectory:
    """Front-ends of one host: a socket per front-end in one private folder."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def _path(self, tag: str) -> str:
        return os.path.join(self.folder, f"{tag}.sock")

    def site(self, runner: web.AppRunner, tag: str) -> web.BaseSite:
        return web.UnixSite(runner, self._path(tag))

    async def publish(self, tag: str, runner: web.AppRunner) -> None:
        """Bound is published."""

    async def withdraw(self, tag: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(tag))

    async def lookup(self, tag: str) -> PeerAddress | None:
        path = self._path(tag)
        return PeerAddress(path=path) if os.path.exists(path) else None  # noqa: ASYNC240 - one stat on local disk

    async def neighbours(self, tag: str) -> dict[str, PeerAddress]:
        """Every other front-end's socket in the folder (the engine link's is there too): the
        workers of one host share its port. A worker that died may have left its socket behind;
        nobody answers there (the caller's concern)."""
        names = os.listdir(self.folder)
        tags = (name.removesuffix(".sock") for name in names if name.endswith(".sock"))
        return {
            other: PeerAddress(path=self._path(other)) for other in tags if is_front_end_tag(other) and other != tag
        }
