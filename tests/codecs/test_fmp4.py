"""H.264 MP4 files and fragmented-MP4 streams decode with PyAV to the frames and rate written."""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
import pytest

from rtserve.codecs.fmp4 import FragmentedMp4Stream, encode_mp4


def _frames(n: int, height: int = 48, width: int = 80) -> np.ndarray:
    # Flat colours that change per frame: H.264 keeps them nearly exact, so order is checkable.
    levels = np.linspace(16, 235, n).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (n, height, width, 3)).copy()


@dataclass(frozen=True)
class VideoInfo:
    codec: str
    average_rate: Fraction | None
    size: tuple[int, int]


def _decode(data: bytes) -> tuple[list[np.ndarray], VideoInfo]:
    """The frames and what the stream says, read while the container is open (PyAV 18.1.1 refuses a
    closed container's stream)."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return frames, VideoInfo(stream.codec_context.name, stream.average_rate, (stream.width, stream.height))


def test_mp4_decodes_to_the_frames_and_rate_written() -> None:
    frames = _frames(17)
    decoded, info = _decode(encode_mp4(frames, 16))
    assert info.codec == "h264"
    assert info.average_rate == 16
    assert info.size == (80, 48)
    assert len(decoded) == 17
    means = [float(f.mean()) for f in decoded]
    assert means == sorted(means)  # frames come back in order
    assert abs(means[0] - 16) < 4 and abs(means[-1] - 235) < 4


def test_fragmented_chunks_concatenate_into_a_playable_file() -> None:
    frames = _frames(13)
    stream = FragmentedMp4Stream(80, 48, 8)
    chunks = [stream.add(frames[:1]), stream.add(frames[1:5]), stream.add(frames[5:9]), stream.add(frames[9:])]
    chunks.append(stream.finish())
    assert chunks[0][4:8] == b"ftyp"  # the first chunk opens with the init segment
    assert all(b"moof" in chunk for chunk in chunks[1:])  # every later one carries media fragments
    decoded, info = _decode(b"".join(chunks))
    assert len(decoded) == 13 and info.average_rate == 8
    # A prefix of the chunks plays too: what a client holds mid-stream is a valid file.
    prefix, _ = _decode(b"".join(chunks[:3]))
    assert 4 <= len(prefix) < 13


def test_finish_twice_adds_nothing() -> None:
    stream = FragmentedMp4Stream(32, 32, 4)
    stream.add(_frames(2, 32, 32))
    assert stream.finish()
    assert stream.finish() == b""


def test_wrong_frame_shape_is_refused() -> None:
    stream = FragmentedMp4Stream(32, 32, 4)
    with pytest.raises(ValueError):
        stream.add(_frames(1, 32, 48))
