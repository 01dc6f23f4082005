"""``rtserve serve|drain|--version``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve import __version__
from rtserve.config import ConfigError, ServerConfig, load_config
from rtserve.log import configure_logging

log = logging.getLogger("rtserve")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rtserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8091)")
    serve.add_argument("--config", help="YAML config file")
    serve.add_argument("--engine", help="engine serving realtime sessions (default cascade)")
    serve.add_argument("--api-key", dest="api_key", help="require this key on every route")
    serve.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--workers",
        type=int,
        help="front-end worker processes beside one engine process (default: from the CPU count; 1 = one process)",
    )
    serve.add_argument("--ssl-certfile", dest="ssl_certfile", help="PEM certificate (chain): serve HTTPS and WSS")
    serve.add_argument("--ssl-keyfile", dest="ssl_keyfile", help="PEM private key of --ssl-certfile")
    serve.add_argument(
        "--enable-sleep-mode",
        dest="enable_sleep_mode",
        action="store_true",
        default=None,
        help="serve POST /v1/omni/sleep and /v1/omni/wakeup",
    )
    serve.add_argument(
        "--ray-address",
        dest="ray_address",
        help="run the engines as Ray actors on this cluster ('auto' or HOST:PORT); needs the 'ray' extra",
    )
    drain = sub.add_parser(
        "drain", help="drain an engine actor or a front-end of a Ray cluster: no new sessions, then it leaves"
    )
    drain.add_argument("--ray-address", dest="ray_address", required=True)
    target = drain.add_mutually_exclusive_group(required=True)
    target.add_argument("--engine", help="engine actor name (cluster.engine_prefix-N)")
    target.add_argument(
        "--front-end",
        dest="front_end",
        help="front-end tag (the part after 'duplex-' in its "
        "session ids, also in its log), or a host name: every "
        "front-end on it; needs RTSERVE_CLUSTER__SECRET",
    )
    drain.add_argument("--deadline", type=float, default=300.0, help="seconds its open sessions may go on")
    drain.add_argument("--namespace", default="rtserve", help="Ray namespace of the engine actors")
    return parser


async def serve(
    config: ServerConfig,
    *,
    engine_socket: str | None = None,
    worker_index: int = 0,
    listener: socket.socket | None = None,
    peer_folder: str | None = None,
) -> bool:
    """Run until SIGTERM/SIGINT or the end of a front-end drain, then stop accepting, close
    sessions, exit. True when it stopped because it was drained.

    With ``engine_socket`` this is one front-end worker of several: engines run in the engine
    process behind that socket, ``listener`` is its share of the port (bound by the supervisor)
    and ``peer_folder`` is where the workers reach each other (resume relays, drain)."""
    from rtserve.app import build_app  # heavy imports only for the serve path
    from rtserve.engines.engine_set import EngineSet
    from rtserve.heap import freeze_long_lived, freeze_when_ready
    from rtserve.web.context import CTX
    from rtserve.web.peers import Peers, SocketDirectory, new_front_end_tag
    from rtserve.web.runner import app_runner, server_ssl_context

    registry = CollectorRegistry()
    engines = None
    peers = None
    if config.cluster.address is not None:  # the engines are Ray actors; Ray is imported only here
        from rtserve.cluster.directory import cluster_peers
        from rtserve.cluster.frontend import cluster_engines

        engines = await cluster_engines(config, registry, worker_index)
        peers = await cluster_peers(config)
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
    served = app[CTX].engines
    if isinstance(served, EngineSet):  # the models load here, in the background
        freeze_when_ready(served)
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

    stop = app[CTX].stop  # also set when a front-end drain ends
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    drained = app[CTX].sessions.draining
    log.info("shutting down%s", " (drained)" if drained else "")
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=config.sessions.shutdown_timeout_s + 5)
    except TimeoutError:
        log.warning("shutdown exceeded its bound; exiting anyway")
    return drained


async def _remote_engines(
    config: ServerConfig, engine_socket: str, worker_index: int, registry: CollectorRegistry
):  # -> RemoteEngines
    from rtserve.engines.remote.client import RemoteEngines
    from rtserve.engines.remote.link import EngineLink
    from rtserve.engines.remote.wire import LinkMetrics

    settings = config.engine_link
    link = EngineLink(
        lambda: asyncio.open_unix_connection(engine_socket),
        worker_index,
        uplink_lead_s=settings.uplink_lead_ms / 1000,
        uplink_last_call_s=settings.uplink_last_call_ms / 1000,
        metrics=LinkMetrics(registry),
    )
    link.start()
    await link.connected.wait()  # the engine process answers at once, before its models load
    assert link.offer is not None
    return RemoteEngines(link, link.offer, max_queued_events=settings.max_queued_events, registry=registry)


def _worker_header(worker: str):  # -> aiohttp on_response_prepare signal handler
    """Which worker answered (index:pid): load balancers and tests can tell workers apart."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Rtserve-Worker"] = worker

    return add


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "drain":
        from rtserve.cluster.drain import drain

        configure_logging("info")  # its progress and errors go to the log, as the server's do
        return drain(args.ray_address, args.namespace, args.deadline, engine=args.engine, front_end=args.front_end)
    flags = {
        k: getattr(args, k)
        for k in (
            "host",
            "port",
            "engine",
            "api_key",
            "log_level",
            "workers",
            "enable_sleep_mode",
            "ssl_certfile",
            "ssl_keyfile",
        )
    }
    if args.ray_address is not None:
        flags["cluster"] = {"address": args.ray_address}
    try:
        config = load_config(args.config, overrides=flags)
        from rtserve.web.runner import server_ssl_context

        server_ssl_context(config)  # a bad certificate or key is a config error, before anything starts
    except ConfigError as exc:
        print(f"rtserve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    try:
        if config.workers > 1:
            from rtserve.processes.supervisor import Supervisor

            return Supervisor(config, config.workers, engine_process=config.cluster.address is None).run()
        asyncio.run(serve(config))
    except ConfigError as exc:  # e.g. an unknown engine name, found when building the app
        print(f"rtserve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rtserve: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
