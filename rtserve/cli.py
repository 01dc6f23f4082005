"""``rtserve serve|download|drain|--version``: parses the command line and hands over to the server
(``processes/``) or the cluster drain; nothing imports this module."""

from __future__ import annotations

import argparse
import asyncio
import sys

from rtserve import __version__
from rtserve.config import ConfigError, load_config
from rtserve.log import configure_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rtserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 8091)")
    serve.add_argument("--config", help="YAML config file")
    serve.add_argument("--engine", help="engine serving realtime sessions (default cascade)")
    serve.add_argument(
        "--weights",
        help="the engine's weights (moshi_engine.weights): a local folder, hf://ORG/NAME[@REVISION] or ORG/NAME",
    )
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
    download = sub.add_parser(
        "download", help="fetch an engine's weights into the hub cache ahead of serving; prints the local folder"
    )
    download.add_argument("weights", help="hf://ORG/NAME[@REVISION] or ORG/NAME (a local folder is checked)")
    download.add_argument("--engine", default="moshi", help="whose files to fetch (default moshi)")
    download.add_argument("--config", help="YAML config file (its 'weights' section)")
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "drain":
        from rtserve.cluster.drain import drain  # Ray: imported only for this command

        configure_logging("info")  # its progress and errors go to the log, as the server's do
        return drain(args.ray_address, args.namespace, args.deadline, engine=args.engine, front_end=args.front_end)
    if args.command == "download":
        return _download(args.weights, args.engine, args.config)
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
    if args.weights is not None:
        flags["moshi_engine"] = {"weights": args.weights}
    # The server's modules (the web layer, engines) load only for ``serve``: ``--version`` stays quick.
    from rtserve.web.runner import server_ssl_context

    try:
        config = load_config(args.config, overrides=flags)
        server_ssl_context(config)  # a bad certificate or key is a config error, before anything starts
    except ConfigError as exc:
        print(f"rtserve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    from rtserve.heap import bound_malloc_arenas

    bound_malloc_arenas()  # before the server starts its threads and processes
    try:
        if config.workers > 1:
            from rtserve.processes.supervisor import Supervisor

            return Supervisor(config, config.workers, engine_process=config.cluster.address is None).run()
        from rtserve.processes.serve import serve

        asyncio.run(serve(config))
    except ConfigError as exc:  # e.g. an unknown engine name, found when building the app
        print(f"rtserve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rtserve: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def _download(weights: str, engine: str, config_file: str | None) -> int:
    from rtserve.weights.download import download  # huggingface_hub: imported only for this command

    try:
        config = load_config(config_file)
        configure_logging("info")  # the download's progress lines
        path = download(weights, engine, config.weights)
    except ConfigError as exc:  # WeightsError too: offline, refused, missing file, disk full
        print(f"rtserve: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
