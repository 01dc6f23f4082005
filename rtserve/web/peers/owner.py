"""Which front-end owns a session, read from the session id (``sessions/ids.new_session_id``).

A front-end's tag is random per process start: a front-end that restarted has lost its
sessions, and its new tag makes the old ids name nobody (``unknown_session`` at once).
"""

from __future__ import annotations

import re
import secrets

_OWNED_ID = re.compile(r"duplex-([0-9a-f]{8})-[0-9a-f]{32}")
_TAG = re.compile(r"[0-9a-f]{8}")


def new_front_end_tag() -> str:
    return secrets.token_hex(4)


def is_front_end_tag(name: str) -> bool:
    return _TAG.fullmatch(name) is not None


def owner_of(session_id: str | None) -> str | None:
    """The tag of the front-end that admitted ``session_id``; None for an id without one."""
    match = _OWNED_ID.fullmatch(session_id or "")
    return match.group(1) if match else None
