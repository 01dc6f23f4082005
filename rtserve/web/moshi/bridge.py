"""The bridge between one engine session and a Moshi-style connection: wire audio in,
agent frames out (one per conversation; not the session core's ``Conversation`` item list).

Shared by ``/api/chat`` (Ogg-Opus) and ``/v1/audio/duplex`` (raw float32). Both speak
24 kHz mono; this class only resamples to and from the engine's rates. Framing belongs
to the engine (its slot takes, at each tick, the audio that arrived), and the engine's
one output hand-off is the only queue: ``frames`` reads it as the socket is ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray  # both Moshi wire formats are 24 kHz mono
from rtserve.codecs.resample import StreamResampler
from rtserve.engines.events import EngineFailure, OutputAudio, OutputText
from rtserve.engines.input_arrivals import InputArrivals
from rtserve.engines.protocols import EngineSession
from rtserve.web.moshi.metrics import MoshiMetrics

_NO_AUDIO = np.zeros(0, np.float32)


@dataclass
class AgentFrame:
    pcm: FloatArray  # float32 mono at the wire rate (24 kHz)
    text: str | None
    produced_at: float  # loop.time() when the frame was read from the engine's hand-off
    # loop.time() the newest input sample the frame's tick stepped reached this bridge (after
    # decoding); None when that tick stepped no new input or the engine does not say (not lockstep).
    input_at: float | None = None
    # time.monotonic() (the loop's clock) its tick was due; None when not lockstep.
    tick_due: float | None = None


class EngineBridge:
    ended_by_server: str | None = None  # a lockstep slot ends only by close or failure

    def __init__(self, session: EngineSession, *, route: str, metrics: MoshiMetrics) -> None:
        caps = session.capabilities
        self.session = session
        self.failure: EngineFailure | None = None
        self._frame_samples = caps.input_frame_samples
        self._to_engine = StreamResampler(WIRE_SAMPLE_RATE, caps.input_sample_rate)
        self._to_wire = StreamResampler(caps.output_sample_rate, WIRE_SAMPLE_RATE)
        self._frames_in = metrics.frames_in.labels(route)
        self._closed = False
        # Engine-rate pushes for the server-path metric; None once the engine's output says
        # nothing about the input it stepped.
        self._arrivals: InputArrivals | None = InputArrivals()

    def push(self, pcm: FloatArray) -> None:
        """User audio at 24 kHz, any length: straight to the engine session."""
        if self._closed or pcm.size == 0:
            return
        self._push_engine_rate(self._to_engine.process(pcm))

    async def drain(self, timeout_s: float) -> bool:
        """Hand over the resampler's tail and wait until the engine stepped all input, produced
        its answer and ``frames`` read it; False when that took longer than ``timeout_s``."""
        if self._closed:
            return True
        self._push_engine_rate(self._to_engine.flush())
        try:
            await asyncio.wait_for(self.session.drain(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def frames(self) -> AsyncIterator[AgentFrame]:
        """Agent frames until the engine ends the session (close or failure)."""
        loop = asyncio.get_running_loop()
        async for event in self.session.events():
            if isinstance(event, OutputAudio):
                yield AgentFrame(
                    self._to_wire.process(event.pcm),
                    event.text or None,
                    loop.time(),
                    self._arrival_of(event.input_samples),
                    event.tick_due,
                )
            elif isinstance(event, OutputText):
                yield AgentFrame(_NO_AUDIO, event.text or None, loop.time())
            elif isinstance(event, EngineFailure):
                self.failure = event
                return
            # turn-engine events (VAD, transcripts) have no Moshi wire form
        # The session ended: what the output resampler still holds is the end of the audio.
        tail = self._to_wire.flush()
        if tail.size:
            yield AgentFrame(tail, None, loop.time())

    async def close(self) -> None:
        """Release the engine slot; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.session.close()

    def _arrival_of(self, stepped: int | None) -> float | None:
        """When the newest of the first ``stepped`` input samples arrived (``InputArrivals``);
        None when no new input was stepped since the last frame."""
        if stepped is None:
            self._arrivals = None
        if self._arrivals is None or stepped is None:
            return None
        return self._arrivals.arrival_of(stepped)

    def _push_engine_rate(self, pcm: FloatArray) -> None:
        if not pcm.size:
            return
        if self._arrivals is not None:
            self._arrivals.push(pcm.size, asyncio.get_running_loop().time())
        self.session.push_audio(pcm)
        self._frames_in.inc(pcm.size / self._frame_samples)
