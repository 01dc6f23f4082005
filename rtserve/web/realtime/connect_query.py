"""What a realtime connection's URL asks of its session: ``session_id`` and ``resume``
(vLLM-Omni, docs/sessions.md#connection-url; read once, at the upgrade).

* ``?session_id=<id>`` names the session the connection opens, on connect or at its
  first ``session.update`` (the PersonaPlex e2e driver's ``autostart=0&session_id=...``
  flow). An id is letters, digits and ``-_.:``, at most ``sessions.max_session_id_chars``;
  one still held by a session (opening, live, or still closing) is refused with
  ``session_exists``. With ``sessions.client_session_ids`` off the parameter is ignored
  and ids are server-allocated (``session.created.session.id`` says which).
* ``?session_id=<id>&resume=<token>`` takes over that session on this connection instead
  of opening one, exactly as a first ``session.resume`` event would: ``session.resumed``
  with the rotated token, the journal replayed after ``last_received_server_event_seq``
  (optional; without it everything still journaled), ``session.replaced`` on the socket
  it supersedes. ``attachment_generation`` may be given; without it the token names the
  generation it was issued with.
* Turn-based connections (no ``duplex=1``, or duplex sessions switched off) ignore
  ``session_id`` (the spec's silent fallback must keep working) but refuse ``resume``:
  their sessions cannot be resumed, and silently opening a new one would lie.

A bad value is ``invalid_value`` naming the parameter; the connection then closes (1008).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp import web

from rtserve.config import SessionLimits
from rtserve.errors import INVALID_VALUE
from rtserve.web.realtime.client_events import ResumeSession
from rtserve.web.realtime.errors import WireError

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]+")


@dataclass(frozen=True, slots=True)
class ConnectQuery:
    session_id: str | None = None  # the name of the session this connection opens
    resume: ResumeSession | None = None  # take over this session instead of opening one


def _count(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise WireError(INVALID_VALUE, f"{name} must be a non-negative integer", param=name)
    return int(raw)


def checked_session_id(session_id: str, limits: SessionLimits, param: str = "session_id") -> str:
    """A client's name for its session, if well formed; raises ``WireError``."""
    if not (_SESSION_ID.fullmatch(session_id) and len(session_id) <= limits.max_session_id_chars):
        raise WireError(
            INVALID_VALUE,
            f"{param} must be 1 to {limits.max_session_id_chars} letters, digits or '-_.:'",
            param=param,
        )
    return session_id


def connect_query(request: web.Request, *, duplex: bool, limits: SessionLimits) -> ConnectQuery:
    """The session part of a connection's URL; raises ``WireError``."""
    token = request.query.get("resume")
    if not duplex:
        if token is not None:
            raise WireError(
                INVALID_VALUE,
                "resume needs a duplex connection (?duplex=1 on a server with duplex "
                "sessions); turn-based sessions cannot be resumed",
                param="resume",
            )
        return ConnectQuery()
    session_id = request.query.get("session_id")
    if session_id is not None:
        checked_session_id(session_id, limits)
    if token is None:
        return ConnectQuery(session_id if limits.client_session_ids else None)
    if session_id is None:
        raise WireError(INVALID_VALUE, "resume needs the session_id of the session to resume", param="session_id")
    if not token:
        raise WireError(INVALID_VALUE, "resume must be the session's resume_token", param="resume")
    return ConnectQuery(
        resume=ResumeSession(
            session_id,
            token,
            _count(request, "attachment_generation"),
            _count(request, "last_received_server_event_seq"),
        )
    )
