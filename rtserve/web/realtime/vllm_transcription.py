"""vLLM's realtime transcription flow on ``/v1/realtime`` (what vLLM and vLLM-Omni's
Qwen3-Omni realtime clients speak; vLLM ``entrypoints/openai/realtime``).

The client sends ``session.update`` with a top-level ``model``, then
``input_audio_buffer.commit`` with ``final: false`` to start a transcription (on an empty
buffer: it opens the stream, it is not a turn), streams appends, and ends the audio with
``commit`` ``final: true``. The server answers ``transcription.delta`` (incremental text)
and ``transcription.done`` (``text``, ``usage``).

Here the first ``final: false`` switches the session to manual turns (server VAD would
cut the stream into turns and answer them) and to transcription events; ``final: true``
commits the turn. The session core's input transcripts are then also sent in vLLM's
shape: the recognizer's partials (the text each adds) as ``transcription.delta``, its final
transcript as the rest of it (where it extends what was sent) and ``transcription.done``. ``usage`` is null (vLLM
allows it): the recognizer does not count tokens.
"""

from __future__ import annotations

from rtserve.engines.events import transcript_growth
from rtserve.sessions import events as ev
from rtserve.sessions.ids import new_event_id
from rtserve.sessions.projections import compact_json


class TranscriptionFlow:
    """Per connection: whether the vLLM flow is on, and the text already sent as deltas."""

    def __init__(self) -> None:
        self.active = False
        self._sent = ""

    def start(self) -> bool:
        """A ``final: false`` commit; True the first time (the session must switch modes)."""
        started, self.active = not self.active, True
        return started

    def frames_after(self, event: ev.SessionEvent) -> list[str]:
        """vLLM frames that follow ``event`` on the wire (none unless the flow is on)."""
        if not self.active:
            return []
        if isinstance(event, ev.InputTranscriptDelta):
            return self._delta(self._sent + event.delta)
        if isinstance(event, ev.InputTranscriptCompleted):
            frames = self._delta(event.transcript)
            self._sent = ""
            frames.append(
                compact_json(
                    {"type": "transcription.done", "event_id": new_event_id(), "text": event.transcript, "usage": None}
                )
            )
            return frames
        return []

    def _delta(self, hypothesis: str) -> list[str]:
        # transcription.done carries the authoritative text, whatever the deltas said.
        delta = transcript_growth(self._sent, hypothesis)
        if not delta:
            return []
        self._sent = hypothesis
        return [compact_json({"type": "transcription.delta", "event_id": new_event_id(), "delta": delta})]
