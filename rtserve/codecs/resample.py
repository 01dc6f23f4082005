"""Sample-rate conversion: whole signals on libsoxr (``soxr`` package), streams on FFmpeg's
libswresample (PyAV's ``AudioResampler``).

``StreamResampler`` keeps filter state across chunks and returns, for every chunk, the
output its input accounts for, less a fixed filter delay of well under a millisecond (16
samples at 24 kHz from 48 kHz): an 80 ms page of 48 kHz audio becomes 1920 samples at
24 kHz, every page. soxr's stream, used here before, emits in filter-sized blocks (470
samples at "LQ" from 48 to 24 kHz, 830 at "HQ"), so the same pages came out as 1880, 1880,
..., 2350 samples and held back up to a block (20-35 ms) of the newest audio: a lockstep
engine then stepped partial frames padded with silence and trimmed the excess later
(docs/engines.md#input-framing). libswresample's default filter (32 taps, cutoff 0.97 of the
output Nyquist) is flat to within 1 dB up to 90 % of it and keeps what folds back under
-90 dB except tones within ~8 % above it (-20 to -34 dB): fine for speech.
"""

from __future__ import annotations

from typing import Literal

import av
import numpy as np
import soxr

from rtserve.codecs.pcm import FloatArray, as_mono_float32

ResampleQuality = Literal["LQ", "MQ", "HQ", "VHQ"]

_EMPTY = np.zeros(0, dtype=np.float32)


def _check_rate(rate: int) -> None:
    if not isinstance(rate, int) or rate <= 0:
        raise ValueError(f"sample rate must be a positive int, got {rate!r}")


def resample(samples: FloatArray, in_rate: int, out_rate: int, quality: ResampleQuality = "HQ") -> FloatArray:
    """Resample a whole mono float32 signal at once; returns the input when rates match."""
    _check_rate(in_rate)
    _check_rate(out_rate)
    samples = as_mono_float32(samples)
    if in_rate == out_rate or samples.size == 0:
        return samples
    resampled: FloatArray = soxr.resample(samples, in_rate, out_rate, quality=quality)
    return resampled


class StreamResampler:
    """Chunked mono float32 resampler; one instance per stream (it holds filter state)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        _check_rate(in_rate)
        _check_rate(out_rate)
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._swr = None if in_rate == out_rate else self._new_swr()

    def _new_swr(self) -> av.AudioResampler:
        return av.AudioResampler(format="flt", layout="mono", rate=self.out_rate)

    def process(self, chunk: FloatArray) -> FloatArray:
        """Feed one chunk; returns the output it completes (possibly empty)."""
        chunk = as_mono_float32(chunk)
        if self._swr is None:
            return chunk
        if not chunk.size:
            return _EMPTY
        # PyAV reads the array's buffer as it is: a strided view must be copied first.
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk).reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self.in_rate
        return _joined(self._swr.resample(frame))

    def flush(self) -> FloatArray:
        """End the stream: return the held-back tail and reset, ready for a new stream."""
        if self._swr is None:
            return _EMPTY
        tail = _joined(self._swr.resample(None))
        self._swr = self._new_swr()
        return tail


def _joined(frames: list[av.AudioFrame]) -> FloatArray:
    if not frames:
        return _EMPTY
    pcm: FloatArray = np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames])
    return pcm
