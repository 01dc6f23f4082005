"""Sample-rate conversion on libsoxr (``soxr`` package).

``StreamResampler`` keeps filter state across chunks, so a stream cut into arbitrary
chunks resamples to the same signal as the one-shot ``resample`` (within float rounding).
soxr emits output in filter-sized blocks and aligns it to the input timeline, so output
lags input. Measured lag with 20 ms chunks: ~38 ms at "HQ" (48k<->24k, 24k<->16k),
~73 ms for 8k<->24k; ~20 ms at "LQ", whose passband is flat only up to ~75 % of the
output Nyquist (fine for speech). ``flush()`` returns the held-back tail.
"""

from __future__ import annotations

from typing import Literal

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

    def __init__(self, in_rate: int, out_rate: int, quality: ResampleQuality = "HQ") -> None:
        _check_rate(in_rate)
        _check_rate(out_rate)
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)
        )

    def process(self, chunk: FloatArray) -> FloatArray:
        """Feed one chunk; returns whatever output is ready (possibly empty)."""
        chunk = as_mono_float32(chunk)
        if self._stream is None:
            return chunk
        ready: FloatArray = self._stream.resample_chunk(chunk)
        return ready

    def flush(self) -> FloatArray:
        """End the stream: return the held-back tail and reset, ready for a new stream."""
        if self._stream is None:
            return _EMPTY
        tail: FloatArray = self._stream.resample_chunk(_EMPTY, last=True)
        self._stream.clear()
        return tail
