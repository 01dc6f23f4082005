"""The engine-side liveness record of one session (docs/sessions.md#resume).

``generation`` names the attachment that currently owns the session. Detach is refused
for a generation older than the current one (a stale socket cannot detach a session
resumed elsewhere). Resume is a compare-and-swap on the generation keyed by the
caller's control id: a retry of the same control id with the same credentials returns
what it was granted the first time; a caller that names no generation (a reconnect URL
carrying only the token) presents the generation its token was issued with; a caller presenting
a token this lease issued with a stale generation gets ``session_resume_conflict``. Anything else, a repeated control id
included, is ``unknown_session`` with the same message as an id that does not exist, so
a guess learns nothing (issue 17). Each grant rotates the resume token; tokens are
compared in constant time.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from rtserve.errors import SESSION_RESUME_CONFLICT, UNKNOWN_SESSION
from rtserve.sessions.errors import SessionError
from rtserve.sessions.ids import new_resume_token

if TYPE_CHECKING:  # the attachment's module imports this one (through the projections)
    from rtserve.sessions.attachment import Attachment

IDLE_TTL_EXPIRED = "idle_ttl_expired"
DISCONNECT_GRACE_EXPIRED = "disconnect_grace_expired"
MAX_DURATION_REACHED = "max_duration_reached"
DETACHED_LIMIT = "detached_limit"


UNKNOWN_SESSION_MESSAGE = "Unknown or expired session"


@dataclass(eq=False)
class Grant:
    generation: int
    resume_token: str
    presented: tuple[int, str]  # the generation and token that earned it: a retry must repeat both
    attachment: Attachment | None = None  # filled in by the manager once the attachment exists


def unknown_session() -> SessionError:
    """The one refusal for a missing session and for wrong credentials alike."""
    return SessionError(UNKNOWN_SESSION, UNKNOWN_SESSION_MESSAGE)


def _same_token(presented: str | None, expected: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


class Lease:
    def __init__(self, now: float, *, remembered_grants: int = 32) -> None:
        self.generation = 0
        self.resume_token = new_resume_token()
        self.last_activity = now
        self.opened_at = now
        self.detached_at: float | None = None
        self._grants: OrderedDict[str, Grant] = OrderedDict()
        self._remembered = remembered_grants
        # Every token issued (earlier ones too, bounded) -> the generation it was issued with.
        self._issued: OrderedDict[str, int] = OrderedDict({self.resume_token: 0})

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

    def resume(self, control_id: str, expected_generation: int | None, resume_token: str | None, now: float) -> Grant:
        if expected_generation is None:  # the token names its generation
            expected_generation = self._generation_of(resume_token)
        # Credentials first: a remembered grant is replayed only to the caller that earned it.
        replay = self._grants.get(control_id)
        if (
            replay is not None
            and replay.presented[0] == expected_generation
            and _same_token(resume_token, replay.presented[1])
        ):
            return replay
        if not any(_same_token(resume_token, issued) for issued in self._issued):
            raise unknown_session()
        if expected_generation != self.generation:  # a former owner: it may learn it was replaced
            raise SessionError(SESSION_RESUME_CONFLICT, f"session was resumed elsewhere (generation {self.generation})")
        if not _same_token(resume_token, self.resume_token):
            raise unknown_session()
        presented = (expected_generation, self.resume_token)
        self.generation += 1
        self.resume_token = new_resume_token()
        self.detached_at = None
        self.last_activity = now
        grant = Grant(self.generation, self.resume_token, presented)
        _remember(self._grants, control_id, grant, self._remembered)
        _remember(self._issued, self.resume_token, self.generation, self._remembered)
        return grant

    def _generation_of(self, resume_token: str | None) -> int:
        """The generation ``resume_token`` was issued with; refused like any wrong credential."""
        for issued, generation in self._issued.items():
            if _same_token(resume_token, issued):
                return generation
        raise unknown_session()

    def duration_expired(self, now: float, max_duration_s: float | None) -> bool:
        """A turn-based session's fixed lifetime (OpenAI's maximum session duration) is over."""
        return max_duration_s is not None and now - self.opened_at >= max_duration_s

    def expiry_reason(self, now: float, idle_ttl_s: float | None, disconnect_grace_s: float) -> str | None:
        if self.detached_at is not None and now - self.detached_at >= disconnect_grace_s:
            return DISCONNECT_GRACE_EXPIRED
        if idle_ttl_s is not None and now - self.last_activity >= idle_ttl_s:
            return IDLE_TTL_EXPIRED
        return None


_Value = TypeVar("_Value")


def _remember(store: OrderedDict[str, _Value], key: str, value: _Value, bound: int) -> None:
    store[key] = value
    while len(store) > bound:
        store.popitem(last=False)
