"""What a WebRTC call does with its session's events: the realtime connection's sender,
except that agent audio plays on the media track.

* ``response.output_audio.delta``: queued on the track (never sent on the data channel,
  as on OpenAI's WebRTC calls); ``response.output_audio.done`` / ``response.done`` mark
  the response's last frame, so the track can announce ``output_audio_buffer.stopped``
  once it has been played out.
* ``input_audio_buffer.speech_started`` with ``interrupt_response`` on: the caller speaks
  over the agent, so whatever is still queued on the track is dropped at once and
  ``output_audio_buffer.cleared`` names each response cut off. The session core interrupts
  a response it is still generating itself (its epoch fence drops that response's audio
  before it reaches this sender); audio it already handed over is only here, so this is
  where it is purged. The ``cleared`` the core sends for the same cut (no audio between)
  is not repeated.
* The client event ``output_audio_buffer.clear`` (WebRTC only) purges the same way.
* A response cut off here after it ended in the session keeps, in the conversation, only
  the audio that was played (``conversation.item.truncated``), as OpenAI's WebRTC server
  does: the transport, not the client, knows what was heard.
"""

from __future__ import annotations

from rtserve.sessions import Delivery, SessionConfig
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.ids import item_id_for_response, new_event_id
from rtserve.sessions.projections import compact_json
from rtserve.web.realtime.connection import Dialect, RealtimeConnection
from rtserve.web.realtime.service import RealtimeService
from rtserve.web.webrtc.audio_out import OutboundAudioTrack
from rtserve.web.webrtc.channel import DataChannelSocket


def buffer_event(kind: str, response_id: str) -> str:
    """``output_audio_buffer.started`` / ``.stopped`` / ``.cleared`` as OpenAI's WebRTC calls send them."""
    return compact_json({"type": f"output_audio_buffer.{kind}", "event_id": new_event_id(), "response_id": response_id})


class CallConnection(RealtimeConnection):
    socket: DataChannelSocket

    def __init__(
        self,
        socket: DataChannelSocket,
        track: OutboundAudioTrack,
        service: RealtimeService,
        dialect: Dialect,
        initial: SessionConfig,
    ) -> None:
        super().__init__(socket, None, service, dialect, initial)  # type: ignore[arg-type]  # the WebSocket surface
        self.socket = socket
        self._track = track
        self._announced: set[str] = set()  # responses announced cleared here since the last audio
        self._queued: tuple[str, float] = ("", 0.0)  # the latest response's audio handed to the track, ms

    async def _deliver(self, delivery: Delivery) -> None:
        event = delivery.event
        if isinstance(event, ev.AudioDelta):
            self._announced.clear()
            queued = self._queued[1] if self._queued[0] == event.response_id else 0.0
            self._queued = (event.response_id, queued + event.duration_ms)
            await self._track.push(event.response_id, event.pcm, event.sample_rate)
            return
        if isinstance(event, ev.AudioDone | ev.ResponseDone):
            self._track.end_response(event.response_id)
        elif isinstance(event, ev.OutputAudioCleared):
            self._track.clear()
            if event.response_id in self._announced:
                return
            self._announced.add(event.response_id)
        await super()._deliver(delivery)
        if isinstance(event, ev.SpeechStarted) and self._interrupts():
            await self.purge()

    def _interrupts(self) -> bool:
        vad = self.handle.config.turn_detection if self.handle is not None else None
        return vad is not None and vad.interrupt_response

    async def purge(self) -> None:
        """Drop the track's queued audio now and say which responses were cut off."""
        for response_id in self._track.clear():
            if response_id not in self._announced:
                self._announced.add(response_id)
                await self.socket.send_str(buffer_event("cleared", response_id))
                self._truncate(response_id)

    def _truncate(self, response_id: str) -> None:
        handle = self.handle
        if handle is None or handle.active_response_id == response_id:
            return  # still generating: the session's own cancel or fence applies (a continuous stream stays open)
        queued = self._queued[1] if self._queued[0] == response_id else 0.0
        heard_ms = int(min(self._track.played_ms(response_id), queued))
        handle.submit(cmd.ConversationItemTruncate(item_id=item_id_for_response(response_id), audio_end_ms=heard_ms))
