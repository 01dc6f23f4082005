"""Turn-based OpenAI Realtime: ``/v1/realtime`` without ``?duplex=1``, or with it while
duplex sessions are switched off (docs/sessions.md#dialects-and-fallback)."""

from __future__ import annotations

from typing import Any

from rtserve.sessions.events import SessionCreated, SessionEvent, SessionUpdated
from rtserve.sessions.projections.realtime import Naming, RealtimeProjection


class TurnBasedProjection(RealtimeProjection):
    """OpenAI Realtime without the duplex extensions in session objects: no capabilities,
    epoch or resume token, so a client that asked for duplex can see it fell back."""

    _DUPLEX_SESSION_KEYS = ("capabilities", "epoch", "turn_id")

    def __init__(self, naming: Naming) -> None:
        super().__init__(naming, duplex=False)
        self.name = f"realtime-{naming}-turns"

    def render(self, event: SessionEvent) -> dict[str, Any]:
        out = super().render(event)
        if isinstance(event, SessionCreated | SessionUpdated):
            for key in self._DUPLEX_SESSION_KEYS:
                out["session"].pop(key, None)
        if isinstance(event, SessionCreated):
            out.pop("attachment_generation", None)
            out.pop("resume_token", None)
        return out
