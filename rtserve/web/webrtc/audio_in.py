"""The caller's microphone into the session: Opus 48 kHz (decoded by aiortc) -> engine rate.

aiortc appends each decoded frame to the remote track's unbounded queue (``track_backlog``):
a track nobody reads grows for the life of the call. One task per call therefore reads the
track from the moment it appears, converts each frame to mono float32, resamples it (the
project's ``StreamResampler``) and submits it as session input. The task only falls
behind when the event loop is starved; then the backlog beyond ``webrtc.inbound_backlog_frames``
is dropped, oldest first, and counted: old microphone audio is worth less than keeping the
conversation in real time.
A frame the session refuses (its input bound, ``input_backpressure``) is dropped and counted.
"""

from __future__ import annotations

import logging
from typing import Protocol

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from prometheus_client import Counter

from rtserve.codecs.pcm import FloatArray, int16_to_float
from rtserve.codecs.resample import StreamResampler
from rtserve.sessions import commands as cmd
from rtserve.sessions.events import ErrorEvent
from rtserve.web.webrtc.track_backlog import shed_backlog

log = logging.getLogger(__name__)


def frame_to_mono(frame: av.AudioFrame) -> FloatArray:
    """A decoded audio frame (s16, packed or planar, any channel count) as mono float32."""
    channels = len(frame.layout.channels)
    data = frame.to_ndarray()
    data = data.reshape(channels, -1) if frame.format.is_planar else data.reshape(-1, channels).T
    if frame.format.name.startswith("s16"):
        samples = data.astype(np.int16, copy=False)  # int16 already: no copy
        mono = int16_to_float(samples[0]) if channels == 1 else int16_to_float(samples).mean(axis=0)
    else:  # float formats
        mono = data.astype(np.float32).mean(axis=0)
    return np.ascontiguousarray(mono, dtype=np.float32)


class SessionInput(Protocol):
    """What the reader needs of its session (a ``SessionHandle``): a way in for audio, and
    whether the session is closing."""

    @property
    def closed(self) -> bool: ...

    def submit(self, command: cmd.AppendAudio) -> ErrorEvent | None:
        """None when admitted; otherwise the refusal."""
        ...


class InboundAudio:
    def __init__(
        self, track: MediaStreamTrack, handle: SessionInput, engine_rate: int, backlog_frames: int, dropped: Counter
    ) -> None:
        self._track = track
        self._handle = handle
        self._engine_rate = engine_rate
        self._backlog_frames = backlog_frames
        self._dropped = dropped
        self._resampler: StreamResampler | None = None
        self.frames = 0
        self.dropped_frames = 0

    async def run(self) -> None:
        while True:
            try:
                frame = await self._track.recv()
            except MediaStreamError:  # the track ended (peer gone, call closed)
                return
            self._shed_backlog()
            if not isinstance(frame, av.AudioFrame):
                continue
            if self._resampler is None or self._resampler.in_rate != frame.sample_rate:
                self._resampler = StreamResampler(frame.sample_rate, self._engine_rate)
            pcm = self._resampler.process(frame_to_mono(frame))
            self.frames += 1
            if self._handle.closed:
                return
            if pcm.size and self._handle.submit(cmd.AppendAudio(audio=pcm)) is not None:
                self._drop(1)

    def _shed_backlog(self) -> None:
        if dropped := shed_backlog(self._track, self._backlog_frames):
            self._drop(dropped)

    def _drop(self, frames: int) -> None:
        if not self.dropped_frames:
            log.info("dropping microphone audio the session cannot take in time")
        self.dropped_frames += frames
        self._dropped.inc(frames)
