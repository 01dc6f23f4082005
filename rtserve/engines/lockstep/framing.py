"""Re-chunk arbitrary-length audio into whole frames (duplex.md §2.8)."""

from __future__ import annotations

import numpy as np

from rtserve.engines.protocols import EngineError, Pcm


class InvalidAudio(EngineError):
    """Audio that cannot be stepped: wrong shape or non-finite samples."""

    code = "invalid_audio"


class FrameChunker:
    """Whole ``frame_size`` frames out, in order; a partial tail waits for more audio."""

    def __init__(self, frame_size: int) -> None:
        if frame_size < 1:
            raise ValueError("frame_size must be >= 1")
        self.frame_size = frame_size
        self._tail = np.zeros(0, np.float32)

    def push(self, pcm: Pcm) -> list[np.ndarray]:
        samples = np.asarray(pcm)
        if samples.ndim != 1 or samples.dtype.kind != "f":
            raise InvalidAudio("audio must be a 1-D float array of mono samples")
        if not np.isfinite(samples).all():
            raise InvalidAudio("audio samples must be finite")
        # concatenate copies: the frames are views of memory the caller cannot touch.
        joined = np.concatenate((self._tail, samples.astype(np.float32, copy=False)))
        whole = joined.size - joined.size % self.frame_size
        self._tail = joined[whole:].copy()
        return [joined[i:i + self.frame_size] for i in range(0, whole, self.frame_size)]

    def flush(self) -> np.ndarray | None:
        """The partial tail zero-padded to a whole frame (never dropped), or None."""
        if self._tail.size == 0:
            return None
        frame = np.zeros(self.frame_size, np.float32)
        frame[:self._tail.size] = self._tail
        self._tail = np.zeros(0, np.float32)
        return frame

    def clear(self) -> None:
        self._tail = np.zeros(0, np.float32)
