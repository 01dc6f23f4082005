"""What a WebRTC call does with its session's events: the transport under its realtime
connection, which plays agent audio on the media track.

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
  the audio that was played: ``interrupt_playback`` says how much of each was heard
  (``RealtimeConnection.interrupt_playback`` truncates the item).
"""

from __future__ import annotations

from aiohttp import WSMessage

from rtserve.sessions import Delivery
from rtserve.sessions import events as ev
from rtserve.sessions.ids import new_event_id
from rtserve.sessions.projections import compact_json
from rtserve.web.realtime.transport import CutOff
from rtserve.web.webrtc.audio_out import OutboundAudioTrack
from rtserve.web.webrtc.channel import DataChannelSocket


def buffer_event(kind: str, response_id: str) -> str:
    """``output_audio_buffer.started`` / ``.stopped`` / ``.cleared`` as OpenAI's WebRTC calls send them."""
    return compact_json({"type": f"output_audio_buffer.{kind}", "event_id": new_event_id(), "response_id": response_id})


class CallTransport:
    """A call's ``EventTransport`` (``web/realtime/transport.py``): events on the data
    channel, agent audio on the media track."""

    def __init__(self, socket: DataChannelSocket, track: OutboundAudioTrack) -> None:
        self._socket = socket
        self._track = track
        self._announced: set[str] = set()  # responses announced cleared here since the last audio
        self._queued: tuple[str, float] = ("", 0.0)  # the latest response's audio handed to the track, ms

    @property
    def closed(self) -> bool:
        return self._socket.closed

    async def receive(self) -> WSMessage:
        return await self._socket.receive()

    async def send_text(self, text: str) -> None:
        await self._socket.send_str(text)

    async def deliver(self, delivery: Delivery) -> None:
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
        await self._socket.send_str(delivery.text)

    async def interrupt_playback(self) -> list[CutOff]:
        """Drop the track's queued audio now and say which responses were cut off."""
        cut = []
        for response_id in self._track.clear():
            if response_id not in self._announced:
                self._announced.add(response_id)
                await self._socket.send_str(buffer_event("cleared", response_id))
                queued = self._queued[1] if self._queued[0] == response_id else 0.0
                cut.append(CutOff(response_id, int(min(self._track.played_ms(response_id), queued))))
        return cut

    async def close(self, code: int, reason: str) -> None:
        await self._socket.close()  # a data channel closes without a code

    def abort(self) -> None:
        """Nothing to drop: a send waiting on a peer that stopped reading ends when the call closes the channel."""
