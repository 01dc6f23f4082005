"""The output side of one session runner: stamping, queuing, and the epoch fence on
queued audio (docs/sessions.md#output-buffer, docs/sessions.md#overflow-policy).

Every event is stamped with the current epoch. The first event that overflows the output
buffer marks the output failed: ordinary events are suppressed from then on, and the
runner's ``on_overflow`` applies the rest of the policy (fail the active response,
notify through the reserve, close with ``output_backpressure``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from rtserve import errors
from rtserve.sessions import events as ev
from rtserve.sessions.buffer import OutputBuffer
from rtserve.sessions.errors import OutputOverflowError
from rtserve.sessions.metrics import SessionMetrics

log = logging.getLogger(__name__)


class SessionOutput:
    def __init__(
        self, session_id: str, buffer: OutputBuffer, metrics: SessionMetrics, on_overflow: Callable[[], None]
    ) -> None:
        self.session_id = session_id
        self.buffer = buffer
        self._metrics = metrics
        self._on_overflow = on_overflow
        self.epoch = 0
        self.failed = False  # an event overflowed: only reserve notifications leave from now on
        self._audible: deque[str] = deque(maxlen=8)  # responses whose audio may still be queued

    def emit(self, event: ev.SessionEvent) -> bool:
        """Stamp and queue; an overflow applies the overflow policy. False when not queued."""
        event.epoch = self.epoch
        if self.failed:
            return False
        try:
            return self.buffer.put(event)
        except OutputOverflowError:
            self.failed = True
            self._metrics.output_overflows.inc()
            log.warning("output buffer overflow: closing the session")
            self._on_overflow()
            return False

    def emit_reserve(self, event: ev.SessionEvent) -> bool:
        """Queue a notification of the overflow policy; omitted when even the reserve is full."""
        event.epoch = self.epoch
        try:
            return self.buffer.put(event)
        except OutputOverflowError:
            return False

    def emit_audio(self, event: ev.AudioDelta) -> bool:
        """Queue agent audio, remembering its response for the next fence."""
        if not self.emit(event):
            return False
        if not self._audible or self._audible[-1] != event.response_id:
            self._audible.append(event.response_id)
        return True

    def error(
        self,
        code: str,
        message: str,
        *,
        error_type: str = errors.INVALID_REQUEST_ERROR,
        related: str | None = None,
        param: str | None = None,
    ) -> None:
        self.emit(
            ev.ErrorEvent(
                session_id=self.session_id,
                code=code,
                message=message,
                error_type=error_type,
                related_event_id=related,
                param=param,
                uses_reserve=error_type == errors.SERVER_ERROR,
            )
        )

    def playing(self) -> bool:
        """Whether agent audio is still queued for the client."""
        return any(self.buffer.holds_audio(response_id) for response_id in self._audible)

    def advance_epoch(self, active_response_id: str | None) -> list[str]:
        """Start the next epoch, dropping queued and held audio of the old one. Returns the
        responses whose audio was cleared (the active one always)."""
        old = self.epoch
        self.epoch += 1
        cleared = [
            response_id
            for response_id in self._audible
            if self.buffer.invalidate(response_id, old) or response_id == active_response_id
        ]
        self._audible.clear()
        return cleared
