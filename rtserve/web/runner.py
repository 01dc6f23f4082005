"""The one place an app's aiohttp runner is built, so ``rtserve serve`` and the tests run
the app under the same connection timeouts (``transport.http_*``, issue 17 item 6).

aiohttp closes a connection that has not delivered a whole request head within its
keep-alive timeout of opening or of its last response, so that one setting bounds idle,
slow-header and silent sockets; request bodies are bounded where handlers read them
(``web/http/common.py``), and an unread body is drained at most ``http_lingering_s``.
"""

from __future__ import annotations

from aiohttp import web

from rtserve.web.context import CTX


def app_runner(app: web.Application) -> web.AppRunner:
    config = app[CTX].config
    return web.AppRunner(app, handle_signals=False, access_log=None,
                         shutdown_timeout=config.sessions.shutdown_timeout_s,
                         keepalive_timeout=config.transport.http_keepalive_timeout_s,
                         lingering_time=config.transport.http_lingering_s)
