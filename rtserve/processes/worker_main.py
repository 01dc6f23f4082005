"""A front-end worker: the whole aiohttp app on its share of the port, engines over the link."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass
from typing import Any

from rtserve.config import ServerConfig
from rtserve.log import configure_logging
from rtserve.processes.engine_main import EXIT_CONFIG_ERROR
from rtserve.processes.orphans import die_with_parent

log = logging.getLogger("rtserve.worker")


# A worker that was drained (``rtserve drain --front-end``) exits with this status; the
# supervisor does not start it again.
EXIT_DRAINED = 3
_RELEASE_WAIT_S = 2.0  # the supervisor looks every 0.2 s, unless it is busy restarting another child


@dataclass(frozen=True)
class ListenerRelease:
    """A drained worker's hand-over of its socket: it ``asks``, the supervisor closes its own
    copy and says it is ``done``; only then does the worker close its copy. The socket leaves the
    port's group when its last copy closes, and connections queued on it then are reset: the
    worker accepts until that moment, so none wait on a socket nobody accepts from."""

    asked: Any  # multiprocessing Events (a spawn context's)
    done: Any

    def __call__(self) -> None:
        self.asked.set()
        if not self.done.wait(_RELEASE_WAIT_S):
            log.warning("the supervisor did not release this worker's socket in time; leaving anyway")


def run(
    settings: dict[str, Any],
    socket_path: str,
    worker_index: int,
    parent_pid: int,
    listener: socket.socket,
    peer_folder: str,
    release: ListenerRelease,
) -> None:
    die_with_parent(parent_pid)
    config = ServerConfig.model_validate(settings)
    configure_logging(config.log_level)
    try:
        # The web layer and its packages: one missing from the install fails here, in one line.
        from rtserve.processes.serve import serve
    except ImportError as exc:
        sys.stderr.write(f"rtserve: a worker cannot start: {exc}\n")
        sys.exit(EXIT_CONFIG_ERROR)
    if asyncio.run(
        serve(
            config,
            engine_socket=socket_path,
            worker_index=worker_index,
            listener=listener,
            peer_folder=peer_folder,
            release_listener=release,
        )
    ):
        sys.exit(EXIT_DRAINED)
