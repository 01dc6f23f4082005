"""The session core's exceptions. Its stable error codes (docs/sessions.md#session-errors) live in
``rtserve.errors`` with every other layer's.

Every refusal reaches clients as an ``ErrorEvent`` (or a ``SessionError`` for control
calls) with one of these codes; messages are short and never contain internal detail.
"""

from __future__ import annotations

from rtserve.errors import RtserveError


class SessionError(RtserveError):
    """A refused control call (open, resume, ...): ``code`` is a constant of ``rtserve.errors``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)


class OutputOverflowError(Exception):
    """An event did not fit its class budget in a session's ``OutputBuffer``."""
