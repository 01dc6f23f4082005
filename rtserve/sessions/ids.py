"""Identifiers the session core allocates. Session ids are server-owned and never reused
(docs/sessions.md#session-ids) unless a duplex client names its session (``?session_id=``, checked by
``web/realtime/connect_query``; unique among the sessions one manager holds at once); event ids
only need to be unique within this process, so they come from a counter behind a random
per-process prefix instead of a uuid per event."""

from __future__ import annotations

import itertools
import secrets
import uuid

_EVENT_PREFIX = secrets.token_hex(4)
_event_counter = itertools.count(1)


def new_session_id(owner: str | None = None) -> str:
    """``owner``: the front-end that admitted the session (``web/peers``), so any other
    front-end can tell from the id alone where a ``session.resume`` must go."""
    return f"duplex-{owner}-{uuid.uuid4().hex}" if owner else f"duplex-{uuid.uuid4().hex}"


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex[:24]}"


def new_item_id() -> str:
    return f"item_{uuid.uuid4().hex[:24]}"


def item_id_for_response(response_id: str) -> str:
    """The assistant item of a response is named after it (docs/sessions.md#duplex-extensions)."""
    return f"item_{response_id}"


def new_event_id() -> str:
    return f"event_{_EVENT_PREFIX}{next(_event_counter):x}"


def new_resume_token() -> str:
    return secrets.token_urlsafe(24)
