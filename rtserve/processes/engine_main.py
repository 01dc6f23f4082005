"""The engine process: builds and starts every engine (``EngineSet``), serves the workers' links."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.log import configure_logging
from rtserve.process_metrics import ProcessMetrics
from rtserve.processes.orphans import die_with_parent

log = logging.getLogger("rtserve.engine")


# A configuration the engines refuse (a missing weight folder, say) or a package missing from
# the install cannot heal by a restart: the process (engine or worker) exits with this status and
# the supervisor stops the server (exit 2) instead of restarting it forever.
EXIT_CONFIG_ERROR = 78  # EX_CONFIG (sysexits.h)


def run(settings: dict[str, Any], socket_path: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    config = ServerConfig.model_validate(settings)
    configure_logging(config.log_level)
    try:
        asyncio.run(_serve(config, socket_path))
    except ConfigError as exc:
        sys.stderr.write(f"rtserve: {exc}\n")  # the one line the CLI prints for a config error
        sys.exit(EXIT_CONFIG_ERROR)
    except ImportError as exc:
        sys.stderr.write(f"rtserve: the engine process cannot start: {exc}\n")
        sys.exit(EXIT_CONFIG_ERROR)


async def _serve(config: ServerConfig, socket_path: str) -> None:
    # Heavy imports (torch, model wheels) only in the process that runs engines.
    from rtserve.engines.engine_set import EngineSet
    from rtserve.engines.remote.server import EngineServer
    from rtserve.heap import freeze_when_ready

    registry = CollectorRegistry()
    process_metrics = ProcessMetrics(registry)
    engines = EngineSet(config, registry)
    server = EngineServer(engines, max_send_buffer_bytes=config.engine_link.max_send_buffer_bytes)
    await server.serve_unix(socket_path)  # workers connect at once and learn what is served
    engines.start()
    process_metrics.start()
    freeze_when_ready(engines)
    stop = asyncio.Event()
    engines.on_change(lambda: None if engines.fatal is None else stop.set())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()
        await process_metrics.stop()
        await engines.stop()
    if engines.fatal is not None:
        raise engines.fatal  # run() prints its one line; the supervisor stops the server (exit 2)
