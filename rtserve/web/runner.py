"""The one place an app's aiohttp runner is built, so ``rtserve serve`` and the tests run
the app under the same connection timeouts (``transport.http_*``, issue 17 item 6).

aiohttp closes a connection that has not delivered a whole request head within its
keep-alive timeout of opening or of its last response, so that one setting bounds idle,
slow-header and silent sockets; request bodies are bounded where handlers read them
(``web/http/common.py``), and an unread body is drained at most ``http_lingering_s``.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.log import server_logger

from rtserve.config import ConfigError, ServerConfig
from rtserve.web.context import CTX


class _RequestHandlerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's request-handler log, less the noise: a request aiohttp cannot parse (a URL or
    header line over its 8190-byte limit, a malformed head) is the client's error, answered
    400 by aiohttp and logged here as one INFO line, not an ERROR with a traceback (issue 30)."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, BadHttpMessage):
            self.info("malformed request refused with %d: %s", exc_info.code, exc_info.message)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def app_runner(app: web.Application) -> web.AppRunner:
    config = app[CTX].config
    return web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=config.sessions.shutdown_timeout_s,
        keepalive_timeout=config.transport.http_keepalive_timeout_s,
        lingering_time=config.transport.http_lingering_s,
        logger=_RequestHandlerLog(server_logger, {}),
    )


def server_ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    """HTTPS/WSS from ``ssl_certfile`` + ``ssl_keyfile`` (a browser on another machine gets the
    microphone only on a secure origin); None serves plain HTTP. Raises ``ConfigError``."""
    if config.ssl_certfile is None and config.ssl_keyfile is None:
        return None
    if config.ssl_certfile is None or config.ssl_keyfile is None:
        raise ConfigError("invalid config: ssl_certfile and ssl_keyfile must be given together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the TLS certificate {config.ssl_certfile} / key {config.ssl_keyfile}: {exc.strerror or exc}"
        ) from None
    return context
