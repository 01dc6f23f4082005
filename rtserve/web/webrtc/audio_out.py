"""The agent's voice as a WebRTC track: 48 kHz mono 20 ms frames, paced in real time.

aiortc's sender pulls ``recv()`` in a loop and encodes each frame to Opus; the track paces
itself (one frame per 20 ms of the loop's clock) and sends silence when nothing is queued,
so the RTP stream never stalls. Agent audio arrives in bursts faster than real time
(``push``, resampled to 48 kHz with the project's ``StreamResampler``); the queue holds at most
``webrtc.outbound_queue_ms`` and ``push`` waits for room, so the call stops reading the
session's (bounded) output buffer instead of growing this one.

Per response, the track reports when its first frame goes out (``on_started``) and when
its last one has gone out after ``end_response`` (``on_stopped``): OpenAI's WebRTC events
``output_audio_buffer.started`` / ``.stopped``. ``clear`` (barge-in) drops everything
queued at once and returns the responses it cut off.
"""

from __future__ import annotations

import asyncio
import fractions
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from prometheus_client import Counter

from rtserve.codecs.pcm import FloatArray, Int16Array, float_to_int16
from rtserve.codecs.resample import StreamResampler

RATE = 48000
FRAME_SAMPLES = 960  # 20 ms
FRAME_S = FRAME_SAMPLES / RATE
_TIME_BASE = fractions.Fraction(1, RATE)


@dataclass(slots=True)
class _Frame:
    response_id: str
    samples: Int16Array  # int16, FRAME_SAMPLES long
    last: bool = False  # the response's final frame (after end_response)


class OutboundAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(
        self,
        max_queue_ms: int,
        on_started: Callable[[str], None],
        on_stopped: Callable[[str], None],
        late_frames: Counter,
    ) -> None:
        super().__init__()
        self._max_frames = max(1, max_queue_ms * RATE // 1000 // FRAME_SAMPLES)
        self._queue: deque[_Frame] = deque()
        self._room = asyncio.Event()
        self._room.set()
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._resampler: StreamResampler | None = None
        self._pending = np.zeros(0, dtype=np.int16)  # resampled audio short of a whole frame
        self._pending_response: str | None = None
        self._playing: str | None = None  # the response whose audio is going out
        self._played: tuple[str, int] = ("", 0)  # the last response played, and its frames sent so far
        self._start: float | None = None
        self._pts = 0
        self.frames_sent = 0
        self.audio_frames_sent = 0
        self._late_frames = late_frames  # frames sent over one frame period late (the loop was busy)

    # ---------------------------------------------------------------- producer side

    async def push(self, response_id: str, pcm: FloatArray, rate: int) -> None:
        """Queue agent audio of ``response_id``; waits while the queue is full."""
        if self._pending_response != response_id:
            self._finish_pending()
            self._pending_response = response_id
            self._resampler = StreamResampler(rate, RATE)
        assert self._resampler is not None
        samples = float_to_int16(self._resampler.process(pcm))
        self._pending = np.concatenate([self._pending, samples]) if self._pending.size else samples
        while self._pending.size >= FRAME_SAMPLES:
            while len(self._queue) >= self._max_frames:
                self._room.clear()
                await self._room.wait()
            if self._pending_response != response_id:  # cleared while waiting
                return
            self._queue.append(_Frame(response_id, self._pending[:FRAME_SAMPLES]))
            self._pending = self._pending[FRAME_SAMPLES:]

    def end_response(self, response_id: str) -> None:
        """No more audio for ``response_id``: flush the resampler and mark its last frame."""
        if self._pending_response != response_id:
            return
        self._finish_pending()
        for frame in reversed(self._queue):
            if frame.response_id == response_id:
                frame.last = True
                return
        if self._playing == response_id:  # everything already went out
            self._playing = None
            self._on_stopped(response_id)

    def clear(self) -> list[str]:
        """Drop all queued and held audio now; the responses that were cut off."""
        cut = list(dict.fromkeys([*([self._playing] if self._playing else []), *(f.response_id for f in self._queue)]))
        self._queue.clear()
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_response = None
        self._resampler = None
        self._playing = None
        self._room.set()
        return cut

    def played_ms(self, response_id: str) -> int:
        """How much of ``response_id`` has gone out (whole frames, tail padding included)."""
        response, frames = self._played
        return frames * FRAME_SAMPLES * 1000 // RATE if response == response_id else 0

    def _finish_pending(self) -> None:
        if self._pending_response is None or self._resampler is None:
            return
        tail = np.concatenate([self._pending, float_to_int16(self._resampler.flush())])
        if tail.size:
            padded = np.zeros(-(-tail.size // FRAME_SAMPLES) * FRAME_SAMPLES, dtype=np.int16)
            padded[: tail.size] = tail
            # The tail may overrun the bound by one frame: end_response cannot wait.
            self._queue.extend(
                _Frame(self._pending_response, padded[i : i + FRAME_SAMPLES])
                for i in range(0, padded.size, FRAME_SAMPLES)
            )
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_response = None
        self._resampler = None

    # ---------------------------------------------------------------- aiortc side

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._start is None:
            # The media path just connected: audio queued before anyone could hear it (a
            # continuous engine streams from the session's start) would only add latency.
            self._start = loop.time()
            self._queue.clear()
            self._room.set()
        due = self._start + self.frames_sent * FRAME_S
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -FRAME_S:
            self._late_frames.inc()
        samples = self._next_samples()
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = _TIME_BASE
        self._pts += FRAME_SAMPLES
        self.frames_sent += 1
        return frame

    def _next_samples(self) -> Int16Array:
        if not self._queue:
            return np.zeros(FRAME_SAMPLES, dtype=np.int16)
        frame = self._queue.popleft()
        if len(self._queue) < self._max_frames:
            self._room.set()
        if self._playing != frame.response_id:
            self._playing = frame.response_id
            self._played = (frame.response_id, 0)
            self._on_started(frame.response_id)
        self._played = (frame.response_id, self._played[1] + 1)
        self.audio_frames_sent += 1
        if frame.last:
            self._playing = None
            self._on_stopped(frame.response_id)
        return frame.samples
