"""The engine-side liveness record of one session (duplex.md §2.6, U.2).

``generation`` names the attachment that currently owns the session. Detach is refused
for a generation older than the current one (a stale socket cannot detach a session
resumed elsewhere). Resume is a compare-and-swap on the generation keyed by the
caller's control id: replaying the same control id returns what it was granted the
first time; any other caller presenting a stale generation gets
``session_resume_conflict``. Each grant rotates the resume token.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rtserve.sessions.errors import SESSION_RESUME_CONFLICT, UNKNOWN_SESSION, SessionError
from rtserve.sessions.ids import new_resume_token

IDLE_TTL_EXPIRED = "idle_ttl_expired"
DISCONNECT_GRACE_EXPIRED = "disconnect_grace_expired"


@dataclass(eq=False)
class Grant:
    generation: int
    resume_token: str
    attachment: Any = None  # filled in by the manager once the attachment exists


class Lease:
    def __init__(self, now: float, *, remembered_grants: int = 32) -> None:
        self.generation = 0
        self.resume_token = new_resume_token()
        self.last_activity = now
        self.detached_at: float | None = None
        self._grants: OrderedDict[str, Grant] = OrderedDict()
        self._remembered = remembered_grants

    @property
    def detached(self) -> bool:
        return self.detached_at is not None

    def touch(self, now: float) -> None:
        self.last_activity = now

    def detach(self, expected_generation: int, now: float) -> bool:
        if expected_generation != self.generation:
            return False
        if self.detached_at is None:
            self.detached_at = now
        return True

    def resume(self, control_id: str, expected_generation: int, resume_token: str | None, now: float) -> Grant:
        replay = self._grants.get(control_id)
        if replay is not None:
            return replay
        if expected_generation != self.generation:
            raise SessionError(SESSION_RESUME_CONFLICT,
                               f"session was resumed elsewhere (generation {self.generation})")
        if resume_token != self.resume_token:
            raise SessionError(UNKNOWN_SESSION, "unknown session or invalid resume token")
        self.generation += 1
        self.resume_token = new_resume_token()
        self.detached_at = None
        self.last_activity = now
        grant = Grant(self.generation, self.resume_token)
        self._grants[control_id] = grant
        while len(self._grants) > self._remembered:
            self._grants.popitem(last=False)
        return grant

    def expiry_reason(self, now: float, idle_ttl_s: float | None, disconnect_grace_s: float) -> str | None:
        if self.detached_at is not None and now - self.detached_at >= disconnect_grace_s:
            return DISCONNECT_GRACE_EXPIRED
        if idle_ttl_s is not None and now - self.last_activity >= idle_ttl_s:
            return IDLE_TTL_EXPIRED
        return None
