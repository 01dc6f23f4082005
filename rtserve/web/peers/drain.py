"""Draining one front-end: no new sessions, its open ones go on, then it leaves.

``drain`` stops admission (a new session is refused with ``server_shutting_down``, so the
client connects again and the load balancer or the kernel picks another front-end),
``/health`` answers 503 ``draining`` (a load balancer takes it out of rotation), sessions
keep streaming and may still be resumed here or through a peer. Once the last session
ended (an event, not a poll) or at the deadline, the front-end stops as on SIGTERM:
sessions still open close with reason ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging

from rtserve.sessions import SessionManager

log = logging.getLogger(__name__)


class FrontEndDrain:
    def __init__(self, sessions: SessionManager, stop: asyncio.Event, default_deadline_s: float) -> None:
        self._sessions = sessions
        self._stop = stop  # what the serve loop waits on, as for SIGTERM
        self._default_deadline_s = default_deadline_s
        self._task: asyncio.Task[None] | None = None
        self.deadline_s: float | None = None

    async def __call__(self, deadline_s: float | None) -> dict[str, object]:
        """Start draining (again: the first deadline stands); what the drain route answers."""
        if self._task is None:
            self.deadline_s = deadline_s or self._default_deadline_s
            self._sessions.drain()
            self._task = asyncio.create_task(self._leave(self.deadline_s), name="front-end-drain")
            log.info(
                "front-end draining: %d sessions open, deadline %g s", self._sessions.active_count(), self.deadline_s
            )
        return {"status": "draining", "sessions": self._sessions.active_count(), "deadline_s": self.deadline_s}

    def cancel(self) -> None:
        """The front-end stops anyway (a signal): nothing left to wait for."""
        if self._task is not None:
            self._task.cancel()

    async def _leave(self, deadline_s: float) -> None:
        try:
            await asyncio.wait_for(self._sessions.wait_idle(), deadline_s)
            log.info("front-end drained: its last session ended")
        except TimeoutError:
            log.warning(
                "front-end drain deadline passed with %d sessions open; closing them", self._sessions.active_count()
            )
        self._stop.set()
