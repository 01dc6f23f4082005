"""Errors of the realtime routes' client frames, as the client receives them in an ``error``
event: a stable code, a message, the ``param`` at fault (docs/serving.md#errors)."""

from __future__ import annotations

import re

from rtserve.errors import INVALID_EVENT, INVALID_REQUEST_ERROR, RtserveError

INVALID_EVENT_MESSAGE = "Invalid or unrecognized client event"
INVALID_BASE64_MESSAGE = "Invalid base64 audio data"

MAX_ECHOED_CHARS = 64  # client strings quoted back in messages are cut to this


class WireError(RtserveError):
    """A client frame the server refuses; rendered as an ``error`` event."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        error_type: str = INVALID_REQUEST_ERROR,
    ) -> None:
        super().__init__(message, code=code, param=param)
        self.event_id = event_id
        self.error_type = error_type


_FIELD = re.compile(r"[a-z][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the client's field path, without union-branch tags
    (``constrained-int``, ``literal['inf']``, model class names, ...)."""
    parts = [str(p) for p in loc if isinstance(p, int) or (_FIELD.fullmatch(p) and p not in _TYPE_TAGS)]
    return ".".join(parts)


def invalid_event(detail: str | None = None, *, param: str | None = None, event_id: str | None = None) -> WireError:
    message = INVALID_EVENT_MESSAGE if detail is None else f"{INVALID_EVENT_MESSAGE}: {detail}"
    return WireError(INVALID_EVENT, message, param=param, event_id=event_id)
