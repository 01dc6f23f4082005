"""The bridge between one engine session and a Moshi-style connection: wire audio in,
agent frames out (one per conversation; not the session core's ``Conversation`` item list).

Shared by ``/api/chat`` (Ogg-Opus) and ``/v1/audio/duplex`` (raw float32). Both speak
24 kHz mono; this class resamples to and from the engine's rates, cuts input into the
engine's frames, and pumps the engine's output into the connection's ``Outbox``
without ever waiting for the client.
"""

from __future__ import annotations

import asyncio

import numpy as np

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE  # both Moshi wire formats are 24 kHz mono
from rtserve.codecs.resample import StreamResampler
from rtserve.engines.lockstep.framing import FrameChunker
from rtserve.engines.protocols import EngineFailure, EngineSession, OutputAudio, OutputText
from rtserve.web.moshi.metrics import MoshiMetrics
from rtserve.web.moshi.outbox import AgentFrame, Outbox

_NO_AUDIO = np.zeros(0, np.float32)


class EngineBridge:
    def __init__(self, session: EngineSession, *, route: str, metrics: MoshiMetrics, outbox_frames: int) -> None:
        caps = session.capabilities
        self.session = session
        self.wire_frame_samples = WIRE_SAMPLE_RATE * caps.chunk_period_ms // 1000
        self.outbox = Outbox(outbox_frames)
        self.failure: EngineFailure | None = None
        self._chunker = FrameChunker(caps.input_frame_samples)
        self._to_engine = StreamResampler(WIRE_SAMPLE_RATE, caps.input_sample_rate)
        self._to_wire = StreamResampler(caps.output_sample_rate, WIRE_SAMPLE_RATE)
        self._frames_in = metrics.frames_in.labels(route)
        self._frames_dropped = metrics.frames_dropped.labels(route)
        self._closed = False

    def push(self, pcm: np.ndarray) -> None:
        """User audio at 24 kHz, any length: whole engine frames go to the engine now."""
        if self._closed or pcm.size == 0:
            return
        self._push_frames(self._chunker.push(self._to_engine.process(pcm)))

    def align_to_chunk_end(self, first_chunk_samples: int, slack_samples: int) -> None:
        """Shift the frame grid so a frame ends ``slack_samples`` before the end of the first
        chunk of user audio, by queueing that much silence first (once, before any audio).

        Clients send whole Opus packets per Ogg page and pages of 80 ms or a divisor of it,
        but a decoder hands each page's audio over minus a hold-back (pre-skip trimming,
        resampler latency). With the grid starting at the first decoded sample, every frame
        would then wait for the *next* page: 80 ms of added latency. Ending frames just
        before page ends lets each page complete a frame on arrival.
        """
        pad = (slack_samples - first_chunk_samples) % self.wire_frame_samples
        if pad:
            self.push(np.zeros(pad, np.float32))

    async def drain_input(self, timeout_s: float) -> bool:
        """Zero-pad the partial tail, queue it, and wait until the engine stepped every
        frame given so far; False when that took longer than ``timeout_s``."""
        if self._closed:
            return True
        frames = self._chunker.push(self._to_engine.flush())
        tail = self._chunker.flush()
        self._push_frames(frames + ([tail] if tail is not None else []))
        try:
            await asyncio.wait_for(self.session.commit_input(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def pump(self) -> None:
        """Engine events -> outbox, until the engine ends the session (close or failure)."""
        loop = asyncio.get_running_loop()
        try:
            async for event in self.session.events():
                if isinstance(event, OutputAudio):
                    frame = AgentFrame(self._to_wire.process(event.pcm), event.text or None, loop.time())
                elif isinstance(event, OutputText):
                    frame = AgentFrame(_NO_AUDIO, event.text or None, loop.time())
                elif isinstance(event, EngineFailure):
                    self.failure = event
                    return
                else:  # turn-engine events (VAD, transcripts) have no Moshi wire form
                    continue
                self._queue(frame)
            # The session ended: what the output resampler still holds is the end of the audio.
            tail = self._to_wire.flush()
            if tail.size:
                self._queue(AgentFrame(tail, None, loop.time()))
        finally:
            self.outbox.close()

    async def close(self) -> None:
        """Release the engine slot; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.session.close()

    def _queue(self, frame: AgentFrame) -> None:
        if not self.outbox.put(frame):
            self._frames_dropped.inc()

    def _push_frames(self, frames: list[np.ndarray]) -> None:
        if not frames:
            return
        for frame in frames:
            self.session.push_audio(frame)
        self._frames_in.inc(len(frames))
