"""A front-end worker: the whole aiohttp app on its share of the port, engines over the link."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any

from rtserve.config import ServerConfig
from rtserve.log import configure_logging
from rtserve.processes.engine_main import EXIT_CONFIG_ERROR
from rtserve.processes.orphans import die_with_parent

log = logging.getLogger("rtserve.worker")


# A worker that was drained (``rtserve drain --front-end``) exits with this status; the
# supervisor does not start it again.
EXIT_DRAINED = 3


def run(
    settings: dict[str, Any],
    socket_path: str,
    worker_index: int,
    parent_pid: int,
    listener: socket.socket,
    peer_folder: str,
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
        serve(config, engine_socket=socket_path, worker_index=worker_index, listener=listener, peer_folder=peer_folder)
    ):
        sys.exit(EXIT_DRAINED)
