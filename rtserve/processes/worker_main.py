"""A front-end worker: the whole aiohttp app on its share of the port, engines over the link."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from rtserve.config import ServerConfig
from rtserve.log import configure_logging
from rtserve.processes.orphans import die_with_parent

log = logging.getLogger("rtserve.worker")


def run(settings: dict[str, Any], socket_path: str, worker_index: int, parent_pid: int,
        listener: socket.socket) -> None:
    die_with_parent(parent_pid)
    config = ServerConfig.model_validate(settings)
    configure_logging(config.log_level)
    from rtserve.cli import serve  # the single-process server loop, reused as is

    asyncio.run(serve(config, engine_socket=socket_path, worker_index=worker_index, listener=listener))
