"""The open WebSockets of one protocol service, and the one way the server closes a socket.

Every WebSocket route registers its socket here for the life of its handler, so that:

* app shutdown closes each socket with 1001 and waits (bounded) for its handler to finish
  (releasing engine slots, policy sessions), then cancels the stragglers;
* an unexpected error ends that one connection only: logged, the client gets 1011, every
  other connection keeps serving (docs/design.md#failure-isolation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import WSCloseCode, web

log = logging.getLogger(__name__)

SHUTDOWN_REASON = "server shutting down"
_MAX_REASON_BYTES = 123  # a close frame's payload is at most 125 bytes, 2 of them the code


async def close_socket(ws: web.WebSocketResponse, code: int, reason: str) -> None:
    """Close with a short reason; a socket that is already gone is not an error."""
    message = reason.encode("utf-8")[:_MAX_REASON_BYTES].decode("utf-8", "ignore").encode("utf-8")
    with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
        await ws.close(code=code, message=message)


def _always() -> bool:
    return True


class Connections:
    def __init__(self, protocol: str, shutdown_timeout_s: float) -> None:
        self._protocol = protocol  # names the connections in log lines
        self._shutdown_timeout_s = shutdown_timeout_s
        self._open: dict[web.WebSocketResponse, tuple[asyncio.Task[object], Callable[[], bool]]] = {}
        self.closing = False  # shutdown began: admit nothing new

    @property
    def count(self) -> int:
        """Sockets open now (a route bounds its connections with it)."""
        return len(self._open)

    @contextlib.asynccontextmanager
    async def track(
        self, ws: web.WebSocketResponse, *, close_at_shutdown: Callable[[], bool] = _always
    ) -> AsyncIterator[None]:
        """Register a prepared socket while its handler runs. ``close_at_shutdown`` is asked at
        shutdown: False leaves the socket to whoever else ends it (a realtime session's last
        event)."""
        task = asyncio.current_task()
        assert task is not None
        self._open[ws] = (task, close_at_shutdown)
        try:
            yield
        except ConnectionResetError:
            log.info("%s client went away mid-response", self._protocol)
        except Exception:
            log.exception("%s connection failed", self._protocol)
            await close_socket(ws, WSCloseCode.INTERNAL_ERROR, "internal error")
        finally:
            del self._open[ws]

    async def close_all(self) -> None:
        """Close the sockets shutdown may close with 1001 and wait (bounded) for their handlers."""
        self.closing = True
        handlers = {ws: task for ws, (task, may_close) in self._open.items() if may_close()}
        if not handlers:
            return
        log.info("closing %d %s connection(s)", len(handlers), self._protocol)
        await asyncio.gather(*(close_socket(ws, WSCloseCode.GOING_AWAY, SHUTDOWN_REASON) for ws in handlers))
        _, pending = await asyncio.wait(handlers.values(), timeout=self._shutdown_timeout_s)
        for task in pending:
            task.cancel()
