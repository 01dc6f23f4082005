"""Logging with the current session id in every record.

The id travels in a context variable, so every log call made while serving a session
(including from tasks it spawns) is tagged without passing the id around.
"""

from __future__ import annotations

import contextvars
import logging

session_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("rtserve_session_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s [session=%(session_id)s] %(message)s"


class SessionIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "session_id"):
            record.session_id = session_id_var.get()
        return True


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(SessionIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log is noisy at info for a streaming server.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
