"""WAV (RIFF/WAVE) read and write: 16-bit PCM and 32-bit float, read as mono float32.

A small RIFF chunk walker instead of the stdlib ``wave`` module, because ``wave`` cannot
read IEEE-float (format 3) or WAVE_FORMAT_EXTENSIBLE files, both of which common tools
write. Multi-channel input is downmixed to mono by averaging. A data chunk whose size
field overstates the file (streamed WAV writes 0xFFFFFFFF) is read to the end of input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rtserve.codecs.errors import InvalidWavError, UnsupportedFormatError
from rtserve.codecs.pcm import FloatArray, as_mono_float32, float_to_int16, int16_to_float, require_finite

WavSampleFormat = Literal["pcm16", "float32"]

_FORMAT_PCM = 1
_FORMAT_FLOAT = 3
_FORMAT_EXTENSIBLE = 0xFFFE
_SUPPORTED = {(_FORMAT_PCM, 16): "pcm16", (_FORMAT_FLOAT, 32): "float32"}
_MAX_SAMPLE_RATE = 768000
_STREAMING_SIZE = 0xFFFFFFFF
_FMT = struct.Struct("<HHIIHH")  # format, channels, rate, byte rate, block align, bits


@dataclass(frozen=True, slots=True)
class WavAudio:
    samples: FloatArray  # mono
    sample_rate: int
    channels: int  # in the file, before downmixing


def read_wav(data: bytes) -> WavAudio:
    """Parse a WAV file held in memory; malformed input raises a ``CodecError``."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        if data[:4] == b"RF64":
            raise UnsupportedFormatError("RF64 WAV files are not supported")
        raise InvalidWavError("not a RIFF/WAVE file")
    offset = 12
    fmt: tuple[str, int, int] | None = None
    while offset + 8 <= len(data):
        chunk_id = data[offset : offset + 4]
        (size,) = struct.unpack_from("<I", data, offset + 4)
        body_start = offset + 8
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(data[body_start : body_start + size])
        elif chunk_id == b"data":
            if fmt is None:
                raise InvalidWavError("WAV data chunk comes before its fmt chunk")
            return _decode_data(data[body_start : body_start + size], *fmt)
        offset = body_start + size + (size & 1)  # chunks are padded to even sizes
    raise InvalidWavError("WAV file has no data chunk" if fmt else "WAV file has no fmt chunk")


def _parse_fmt(chunk: bytes) -> tuple[str, int, int]:
    if len(chunk) < _FMT.size:
        raise InvalidWavError("WAV fmt chunk is truncated")
    format_tag, channels, rate, _, block_align, bits = _FMT.unpack_from(chunk)
    if format_tag == _FORMAT_EXTENSIBLE:
        # cbSize, valid bits, channel mask, then a GUID whose first two bytes are the format tag.
        if len(chunk) < 26:
            raise InvalidWavError("WAV extensible fmt chunk is truncated")
        (format_tag,) = struct.unpack_from("<H", chunk, 24)
    if channels < 1:
        raise InvalidWavError("WAV file declares zero channels")
    if not 1 <= rate <= _MAX_SAMPLE_RATE:
        raise InvalidWavError(f"WAV sample rate {rate} is out of range")
    sample_format = _SUPPORTED.get((format_tag, bits))
    if sample_format is None:
        raise UnsupportedFormatError(
            f"WAV format tag {format_tag} with {bits}-bit samples is not supported (16-bit PCM or 32-bit float)"
        )
    if block_align != channels * bits // 8:
        raise InvalidWavError(f"WAV block align {block_align} does not match {channels} x {bits}-bit samples")
    return sample_format, channels, rate


def _decode_data(chunk: bytes, sample_format: str, channels: int, rate: int) -> WavAudio:
    width = 2 if sample_format == "pcm16" else 4
    usable = len(chunk) - len(chunk) % (width * channels)  # drop a trailing partial frame
    if sample_format == "pcm16":
        samples = int16_to_float(np.frombuffer(chunk, dtype="<i2", count=usable // 2))
    else:
        samples = require_finite(np.frombuffer(chunk, dtype="<f4", count=usable // 4).astype(np.float32))
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1, dtype=np.float32)
    return WavAudio(samples=samples, sample_rate=rate, channels=channels)


def wav_header(sample_rate: int, sample_format: WavSampleFormat = "pcm16", num_samples: int | None = None) -> bytes:
    """Header of a mono WAV file. ``num_samples=None`` writes the streaming sizes
    (0xFFFFFFFF), for responses whose length is not known up front."""
    if not 1 <= sample_rate <= _MAX_SAMPLE_RATE:
        raise ValueError(f"sample rate {sample_rate} is out of range")
    format_tag, width = (_FORMAT_PCM, 2) if sample_format == "pcm16" else (_FORMAT_FLOAT, 4)
    data_size = _STREAMING_SIZE if num_samples is None else num_samples * width
    riff_size = _STREAMING_SIZE if num_samples is None else 4 + (8 + _FMT.size) + 8 + data_size
    fmt = _FMT.pack(format_tag, 1, sample_rate, sample_rate * width, width, width * 8)
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", data_size)
    )


def wav_frames(samples: FloatArray, sample_format: WavSampleFormat = "pcm16") -> bytes:
    """Sample bytes for the data chunk (also the body chunks of a streamed WAV)."""
    samples = as_mono_float32(samples)
    if sample_format == "pcm16":
        return float_to_int16(samples).astype("<i2", copy=False).tobytes()
    return samples.astype("<f4", copy=False).tobytes()


def write_wav(samples: FloatArray, sample_rate: int, sample_format: WavSampleFormat = "pcm16") -> bytes:
    """A complete mono WAV file."""
    frames = wav_frames(samples, sample_format)
    width = 2 if sample_format == "pcm16" else 4
    return wav_header(sample_rate, sample_format, len(frames) // width) + frames
