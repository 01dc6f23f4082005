"""What every projection provides, plus the compact-JSON helpers the output buffer and the
delivery path share (the buffer counts exactly the bytes that go on the wire)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from rtserve.sessions import events as ev
from rtserve.sessions.events import SessionEvent

# Lifecycle and error events are named alike in every dialect.
SESSION_EVENT_NAMES: dict[type[SessionEvent], str] = {
    ev.SessionCreated: "session.created",
    ev.SessionUpdated: "session.updated",
    ev.HeartbeatAck: "session.heartbeat_ack",
    ev.SessionClosed: "session.closed",
    ev.SessionExpired: "session.expired",
    ev.SessionResumed: "session.resumed",
    ev.SessionReplaced: "session.replaced",
    ev.ResyncRequired: "session.resync_required",
    ev.ErrorEvent: "error",
}

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def compact_json(obj: Any) -> str:
    """JSON with ``,``/``:`` separators and no ASCII escaping (docs/sessions.md#output-buffer)."""
    return _encoder.encode(obj)


def utf8_len(text: str) -> int:
    # Base64 audio keeps almost every payload ASCII: skip the UTF-8 encode then.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def compact_json_with_blob(obj: dict[str, Any], key: str) -> str:
    """``compact_json(obj)`` where ``obj[key]`` is a large base64 string: the blob is
    spliced in after encoding instead of being scanned for escapes (base64 needs none).
    The text is byte-identical to ``compact_json(obj)``; ``obj`` is left unchanged."""
    blob = obj[key]
    text = compact_json({**obj, key: ""})
    marker = f'"{key}":""'  # a key appears once; quotes inside values are always escaped
    at = text.index(marker)
    return f'{text[:at]}"{key}":"{blob}"{text[at + len(marker) :]}'


def with_seq(text: str, seq: int) -> str:
    """Add ``server_event_seq`` to a rendered event without re-serialising it."""
    return f'{text[:-1]},"server_event_seq":{seq}}}'


class Projection(Protocol):
    """Renders one typed event as exactly one wire event."""

    name: str

    def render(self, event: SessionEvent) -> dict[str, Any]: ...

    def render_text(self, event: SessionEvent) -> str: ...
