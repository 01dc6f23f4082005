"""The in-process face of one session: what a transport (or a Python caller) holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rtserve.engines.values import ChatMessage, EngineCapabilities
from rtserve.sessions.attachment import Attachment
from rtserve.sessions.commands import Command
from rtserve.sessions.events import ErrorEvent
from rtserve.sessions.lease import Lease
from rtserve.sessions.session_config import SessionConfig

if TYPE_CHECKING:
    from rtserve.sessions.manager import SessionManager
    from rtserve.sessions.runner import SessionRunner


class SessionHandle:
    """``submit`` commands, iterate ``attachment`` for events, ``close`` when done."""

    def __init__(
        self, manager: SessionManager, runner: SessionRunner, lease: Lease, attachment: Attachment | None = None
    ) -> None:
        self._manager = manager
        self._runner = runner
        self._lease = lease
        self.session_id = runner.session_id
        self.capabilities: EngineCapabilities = runner.capabilities
        self.attachment = attachment  # the first consumer (from open); resumes make new ones

    def submit(self, command: Command) -> ErrorEvent | None:
        """None when admitted; otherwise the refusal. Refusals of a live session are also on
        its stream; ``unknown_session`` (the stream is over) is only returned."""
        return self._manager.submit(self.session_id, command)

    def report(self, error: ErrorEvent) -> bool:
        """Queue a transport-found error on this session's stream; False when it is gone."""
        return self._manager.report(self.session_id, error)

    async def close(self, reason: str = "client_close") -> int | None:
        """Close and wait for the terminal event to be queued (idempotent)."""
        return await self._manager.close(self.session_id, reason)

    @property
    def closed(self) -> bool:
        return self._runner.closing or self._runner.stop_request is not None

    @property
    def config(self) -> SessionConfig:
        return self._runner.config

    @property
    def epoch(self) -> int:
        return self._runner.epoch

    @property
    def active_response_id(self) -> str | None:
        return self._runner.active_response_id

    @property
    def history(self) -> tuple[ChatMessage, ...]:
        """Conversation history as the engine will see it (committed messages)."""
        return self._runner.history

    @property
    def lease_generation(self) -> int:
        return self._lease.generation

    @property
    def resume_token(self) -> str:
        return self._lease.resume_token
