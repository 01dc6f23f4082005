"""``SttStream``: one client's speech-to-text stream on one lockstep slot, on the event loop
(docs/engines.md#kyutai-stt-engine).

Audio goes to the slot in whole frames only (a tail waits here for the rest of its frame),
so the scheduler never pads a frame with silence in the middle of speech. Each output frame
of the slot becomes, in order: a ``Step`` (end-of-turn probabilities), the ``Word`` /
``EndWord`` its text token completes (``WordTracker``), and the ``Marker``s now due.

A marker is due once the whole frames sent before it have been stepped (the frame's
``input_samples`` says how many samples were; a tail short of a frame waits for the next)
and the model's delay has passed since that step.
``end_input`` feeds the delay's worth of silence (plus the tail frame, zero-padded) so the
last words come out, then ``events`` ends with whatever word was still open. ``flush`` feeds
the same silence mid-stream and asks the scheduler to step it in the ticks' spare time (drain
steps), so the words sent so far and the markers placed so far come out in a few ticks instead
of the delay's worth of real time; the stream goes on after it. Markers count the client's
samples: the silence inserted is not among them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.kyutai_stt.events import Marker, Step, SttEvent
from rtserve.engines.kyutai_stt.settings import SttSettings
from rtserve.engines.kyutai_stt.words import WordTracker
from rtserve.engines.lockstep.framing import check_audio
from rtserve.engines.lockstep.lease import SlotLease
from rtserve.engines.values import FrameOutput, Pcm

# Steps remembered for markers placed behind the audio already stepped (6 s at 12.5 Hz).
_STEP_HISTORY = 75
# Flushes remembered for markers placed behind them (a session flushes once a turn).
_FLUSH_HISTORY = 16


@dataclass
class _PendingMarker:
    id: int | None  # None: the end of input
    samples: int  # samples sent before it
    due: int | None = None  # the step index at which it is answered, once its samples were stepped


class SttStream:
    def __init__(self, lease: SlotLease, settings: SttSettings, tracker: WordTracker, frame_size: int) -> None:
        self._lease = lease
        self._settings = settings
        self._tracker = tracker
        self._frame_size = frame_size
        self._tail = np.zeros(0, np.float32)
        self._sent = 0  # samples the client sent, the tail included
        self._inserted = 0  # samples of silence ``flush`` inserted
        # The latest flushes: (client samples before it, samples inserted before it).
        self._flushes: deque[tuple[int, int]] = deque(maxlen=_FLUSH_HISTORY)
        self._markers: deque[_PendingMarker] = deque()
        # (step index, samples stepped by then) of recent steps: a marker placed behind the audio
        # already stepped is due the model's delay after the step that took its samples.
        self._stepped: deque[tuple[int, int]] = deque(maxlen=_STEP_HISTORY)
        self._ended = False
        self._closed = False

    @property
    def delay_frames(self) -> int:
        """Steps between a frame and the step that reports its text (what a marker waits after its audio)."""
        return self._settings.delay_frames

    @property
    def buffered_samples(self) -> int:
        """Samples received (and inserted) and not stepped yet."""
        return self._sent + self._inserted - self._lease.samples_consumed - self._lease.samples_discarded

    def _queued(self, samples: int) -> int:
        """Where the client's first ``samples`` end in the slot's input: with the silence inserted
        before them, not what was inserted right after them (a marker behind more than
        ``_FLUSH_HISTORY`` flushes counts from the oldest one remembered)."""
        inserted = self._inserted
        for before, earlier in reversed(self._flushes):
            if before < samples:
                break
            inserted = earlier
        return samples + inserted

    @property
    def pending_markers(self) -> int:
        """Client markers not answered yet."""
        return sum(marker.id is not None for marker in self._markers)

    def push_audio(self, pcm: Pcm) -> None:
        """Queue float mono samples of any length; ``InvalidAudio`` for non-finite or misshapen ones."""
        samples = check_audio(pcm)
        if self._ended or self._closed or not samples.size:
            return
        self._sent += samples.size
        self._push(np.concatenate([self._tail, samples]) if self._tail.size else samples)

    def _push(self, samples: FloatArray) -> None:
        whole = samples.size - samples.size % self._frame_size
        if whole:
            self._lease.push_samples(np.ascontiguousarray(samples[:whole]))
        self._tail = samples[whole:].copy()

    def mark(self, marker_id: int, samples: int | None = None) -> None:
        """Answer ``Marker(marker_id)`` once everything sent so far is transcribed, or only its first
        ``samples`` (a turn that ended earlier in the audio sent: its words are out sooner)."""
        if self._ended:
            return
        sent = self._sent - self._tail.size
        marker = _PendingMarker(marker_id, self._queued(sent if samples is None else max(0, min(samples, sent))))
        marker.due = next(
            (index + self._settings.delay_frames for index, stepped in self._stepped if stepped >= marker.samples),
            None,
        )
        self._markers.append(marker)

    def end_input(self) -> None:
        """No more audio: drain the model's delay with silence; ``events`` then ends."""
        if self._ended or self._closed:
            return
        self._markers.append(_PendingMarker(None, self._queued(self._sent)))
        self._push_delay()
        self._ended = True

    def flush(self) -> None:
        """Step the model's delay now, on inserted silence: what was sent so far (its tail
        zero-padded to a frame) is transcribed and the markers placed so far answered within a few
        ticks where the scheduler has room, not the delay's worth of real time later. The words
        said after it are timed that much later (the model heard the silence)."""
        if self._ended or self._closed:
            return
        self._flushes.append((self._sent, self._inserted))
        self._inserted += self._push_delay()
        # Every whole frame queued, the audio not stepped yet before the silence included.
        self._lease.scheduler.drain_soon(self._lease, self.buffered_samples // self._frame_size)

    def _push_delay(self) -> int:
        """Queue the tail padded to a frame, then the model's delay in frames of silence; the samples added."""
        pad = -self._tail.size % self._frame_size
        silence = np.zeros(pad + self._settings.delay_frames * self._frame_size, np.float32)
        self._push(np.concatenate([self._tail, silence]))
        return silence.size

    async def events(self) -> AsyncGenerator[SttEvent, None]:
        """The stream's events until ``end_input`` drained or the slot closed; a failure raises ``EngineError``."""
        while True:
            item = await self._lease.next_output()
            if item is None:
                return
            if isinstance(item, EngineFailure):
                raise EngineError(item.message, code=item.code)
            output, _epoch = item
            events, finished = self._read(output)
            for event in events:
                yield event
            if finished:
                for event in self._tracker.flush():
                    yield event
                return

    def _read(self, output: FrameOutput) -> tuple[list[SttEvent], bool]:
        step = output.transcript
        if step is None:
            return [], False
        events: list[SttEvent] = [Step(step.index + 1, step.scores, max(0, self.buffered_samples))]
        events += self._tracker.feed(step.index - self._settings.max_delay, step.token)
        stepped = output.input_samples or 0
        self._stepped.append((step.index, stepped))
        for marker in self._markers:
            if marker.due is None and stepped >= marker.samples:
                marker.due = step.index + self._settings.delay_frames
        while self._markers and self._markers[0].due is not None and step.index >= self._markers[0].due:
            marker = self._markers.popleft()
            if marker.id is None:
                return events, True
            events.append(Marker(marker.id))
        return events, False

    async def close(self, release_timeout_s: float) -> None:
        """Release the slot (output not read yet is dropped). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._lease.release()
        await self._lease.wait_released(release_timeout_s)
