"""``rtserve serve|--version``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

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
    return parser


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM/SIGINT, then drain: stop accepting, close sessions, exit."""
    from rtserve.app import build_app  # heavy imports only for the serve path

    app = build_app(config)
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           shutdown_timeout=config.sessions.shutdown_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info("rtserve %s listening on http://%s:%d (engine %s)", __version__, config.host, config.port,
             config.engine)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=config.sessions.shutdown_timeout_s + 5)
    except TimeoutError:
        log.warning("shutdown exceeded its bound; exiting anyway")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    flags = {k: getattr(args, k) for k in ("host", "port", "engine", "api_key", "log_level")}
    try:
        config = load_config(args.config, overrides=flags)
    except ConfigError as exc:
        print(f"rtserve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    try:
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
