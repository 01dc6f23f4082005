"""The server loop of one front-end: ``rtserve serve`` with ``--workers 1`` runs it in the one
process (engines included); with more, each worker process runs it (``worker_main.py``) with
its engines behind the engine link."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve import __version__
from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.remote.client import RemoteEngines
from rtserve.engines.remote.link import EngineLink
from rtserve.engines.remote.wire import LinkMetrics
from rtserve.engines.remote.worker_cascade import host_cascade_sessions
from rtserve.heap import freeze_long_lived, freeze_when_ready
from rtserve.web.context import CTX, Engines
from rtserve.web.peers import Peers, SocketDirectory, new_front_end_tag
from rtserve.web.runner import app_runner, server_ssl_context

log = logging.getLogger("rtserve")


async def serve(
    config: ServerConfig,
    *,
    engine_socket: str | None = None,
    worker_index: int = 0,
    listener: socket.socket | None = None,
    peer_folder: str | None = None,
    release_listener: Callable[[], None] | None = None,
) -> bool:
    """Run until SIGTERM/SIGINT or the end of a front-end drain, then stop accepting, close
    sessions, exit. True when it stopped because it was drained.

    With ``engine_socket`` this is one front-end worker of several: engines run in the engine
    process behind that socket, ``listener`` is its share of the port (bound by the supervisor)
    and ``peer_folder`` is where the workers reach each other (resume relays, drain);
    ``release_listener`` has the supervisor give up its copy of ``listener`` before a drained
    worker closes its own (``worker_main.ListenerRelease``)."""
    registry = CollectorRegistry()
    engines: Engines | None = None
    peers: Peers | None = None
    if config.cluster.address is not None:  # the engines are Ray actors; Ray is imported only here
        from rtserve.cluster.directory import cluster_peers
        from rtserve.cluster.frontend import cluster_engines

        engines = await cluster_engines(config, registry, worker_index)
        peers = await cluster_peers(config, config.port if listener is None else listener.getsockname()[1])
    elif engine_socket is not None:
        engines = await _remote_engines(config, engine_socket, worker_index, registry)
    if peers is None and peer_folder is not None:
        peers = Peers(new_front_end_tag(), SocketDirectory(peer_folder), config.peers)
    app = build_app(config, engines=engines, registry=registry, peers=peers)
    if engine_socket is not None:
        app.on_response_prepare.append(_worker_header(f"{worker_index}:{os.getpid()}"))
    runner = app_runner(app)
    await runner.setup()
    tls = server_ssl_context(config)
    site = (
        web.TCPSite(runner, config.host, config.port, ssl_context=tls)
        if listener is None
        else web.SockSite(runner, listener, ssl_context=tls)
    )
    await site.start()
    stop = app[CTX].stop  # also set when a front-end drain ends, or when the engines refuse their config
    served = app[CTX].engines
    if isinstance(served, EngineSet):  # the models load here, in the background
        freeze_when_ready(served)
        served.on_change(lambda: None if served.fatal is None else stop.set())
        if served.fatal is not None:  # it failed before the listener was there
            stop.set()
    else:  # a worker: its engines live in the engine process (or Ray actors)
        freeze_long_lived()
    if engine_socket is None:
        log.info(
            "rtserve %s listening on %s://%s:%d (engine %s)",
            __version__,
            "https" if tls else "http",
            config.host,
            config.port,
            config.engine,
        )

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    drained = app[CTX].sessions.draining
    log.info("shutting down%s", " (drained)" if drained else "")
    if drained and release_listener is not None:
        await asyncio.to_thread(release_listener)  # still accepting meanwhile
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=config.sessions.shutdown_timeout_s + 5)
    except TimeoutError:
        log.warning("shutdown exceeded its bound; exiting anyway")
    if isinstance(served, EngineSet) and served.fatal is not None:
        raise served.fatal  # the CLI prints its one line and exits 2
    return drained


async def _remote_engines(
    config: ServerConfig, engine_socket: str, worker_index: int, registry: CollectorRegistry
) -> RemoteEngines:
    settings = config.engine_link
    link = EngineLink(
        lambda: asyncio.open_unix_connection(engine_socket),
        worker_index,
        settings=settings,
        metrics=LinkMetrics(registry),
    )
    link.start()
    await link.connected.wait()  # the engine process answers at once, before its models load
    assert link.offer is not None
    engines = RemoteEngines(link, link.offer, max_queued_events=settings.max_queued_events, registry=registry)
    host_cascade_sessions(config, engines, registry)
    return engines


def _worker_header(worker: str) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """Which worker answered (index:pid): load balancers and tests can tell workers apart."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Rtserve-Worker"] = worker

    return add
