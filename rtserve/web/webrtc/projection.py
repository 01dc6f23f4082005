"""What a WebRTC call's session renders: OpenAI Realtime GA events, except agent audio.

Agent audio plays on the call's media track (``events.CallTransport``), never on the data
channel, so its event is rendered without the base64 payload: the session core would
otherwise encode every audio chunk for nobody (OpenAI's WebRTC sessions send no
``response.output_audio.delta`` either).
"""

from __future__ import annotations

from typing import Any

from rtserve.sessions import events as ev
from rtserve.sessions.projections import TurnBasedProjection
from rtserve.sessions.projections.base import compact_json


class WebRtcProjection:
    name = "realtime-ga-webrtc"

    def __init__(self) -> None:
        self._events = TurnBasedProjection("ga")

    def render(self, event: ev.SessionEvent) -> dict[str, Any]:
        if type(event) is ev.AudioDelta:
            return {"type": "response.output_audio.delta", "event_id": event.event_id, "response_id": event.response_id}
        return self._events.render(event)

    def render_text(self, event: ev.SessionEvent) -> str:
        return compact_json(self.render(event))
