"""H.264 video in MP4, with PyAV: whole files for downloads, fragmented MP4 while frames arrive.

Video jobs (``GET /v1/videos/{id}/content``, ``POST /v1/videos/sync``) answer one progressive MP4;
``WS /v1/realtime/video`` sends fragmented MP4 (an init segment, then ``moof``+``mdat`` pairs) as
the frames are decoded, so a client that concatenates the binary messages in order holds a
playable file at every point (docs/serving.md#streaming-video-output).

Encoding is libx264 from PyAV's bundled ffmpeg, tuned for latency when streaming (no B-frames,
no lookahead: a frame's packet leaves the encoder with that frame). ffmpeg's MP4 muxer writes a
fragment once the next packet arrives (``frag_every_frame``), so a chunk carries every frame of
its segment but the last, which opens the next chunk; ``finish`` flushes it.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import av
import numpy as np
import numpy.typing as npt

RgbFrames = npt.NDArray[np.uint8]
"""Video frames as ``(frames, height, width, 3)`` RGB bytes."""

CODEC = "libx264"
_STREAM_OPTIONS = {"preset": "veryfast", "tune": "zerolatency"}
_FILE_OPTIONS = {"preset": "veryfast"}
_FRAGMENTED = {"movflags": "frag_every_frame+empty_moov+default_base_moof"}


def check_frames(frames: RgbFrames) -> None:
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"video frames must be (n, height, width, 3) uint8, not {frames.shape} {frames.dtype}")


class _Chunks(io.RawIOBase):
    """A write-only sink PyAV muxes into; ``take`` hands over what was written since the last call.
    Not seekable, so the muxer never goes back: every byte written is final."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        return len(chunk)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class _H264Writer:
    """One H.264 stream in one MP4 container written to ``sink``."""

    def __init__(
        self, sink: Any, width: int, height: int, fps: int, *, options: dict[str, str], fragmented: bool
    ) -> None:
        if width % 2 or height % 2 or width <= 0 or height <= 0:
            raise ValueError(f"H.264 needs even frame sides, not {width}x{height}")  # requests are checked first
        self._container = av.open(sink, mode="w", format="mp4", options=_FRAGMENTED if fragmented else {})
        stream = self._container.add_stream(CODEC, rate=Fraction(fps), options=options)
        assert isinstance(stream, av.VideoStream)  # a video codec's stream
        self._stream = stream
        self._stream.width = width
        self._stream.height = height
        self._stream.pix_fmt = "yuv420p"
        self._stream.codec_context.time_base = Fraction(1, fps)
        self._shape = (height, width, 3)
        self._pts = 0

    def write(self, frames: RgbFrames) -> None:
        check_frames(frames)
        if frames.shape[1:] != self._shape:
            raise ValueError(f"frame size {frames.shape[1:]} differs from the stream's {self._shape}")
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = self._pts
            self._pts += 1
            self._container.mux(self._stream.encode(frame))

    def close(self) -> None:
        self._container.mux(self._stream.encode(None))  # the encoder's last packets
        self._container.close()


def encode_mp4(frames: RgbFrames, fps: int) -> bytes:
    """``frames`` as one progressive MP4 file (H.264, ``fps`` frames a second)."""
    check_frames(frames)
    out = io.BytesIO()
    writer = _H264Writer(out, frames.shape[2], frames.shape[1], fps, options=_FILE_OPTIONS, fragmented=False)
    writer.write(frames)
    writer.close()
    return out.getvalue()


class FragmentedMp4Stream:
    """Frames in, fragmented-MP4 bytes out: ``add`` returns the bytes its frames completed (the
    first call's start with the init segment), ``finish`` the rest. Not thread-safe: one owner."""

    def __init__(self, width: int, height: int, fps: int) -> None:
        self._sink = _Chunks()
        self._writer = _H264Writer(self._sink, width, height, fps, options=_STREAM_OPTIONS, fragmented=True)
        self._open = True

    def add(self, frames: RgbFrames) -> bytes:
        self._writer.write(frames)
        return self._sink.take()

    def finish(self) -> bytes:
        if self._open:
            self._open = False
            self._writer.close()
        return self._sink.take()
