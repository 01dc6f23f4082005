"""Validation of audio pushed into a lockstep slot (framing itself is the slot's ``InputBacklog``)."""

from __future__ import annotations

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.values import Pcm
from rtserve.errors import INVALID_AUDIO


class InvalidAudio(EngineError):
    """Audio that cannot be stepped: wrong shape or non-finite samples."""

    code = INVALID_AUDIO


def check_audio(pcm: Pcm) -> FloatArray:
    """``pcm`` as 1-D float32 mono samples; ``InvalidAudio`` when it cannot be stepped."""
    samples = np.asarray(pcm)
    if samples.ndim != 1 or samples.dtype.kind != "f":
        raise InvalidAudio("audio must be a 1-D float array of mono samples")
    if not np.isfinite(samples).all():
        raise InvalidAudio("audio samples must be finite")
    return samples.astype(np.float32, copy=False)
