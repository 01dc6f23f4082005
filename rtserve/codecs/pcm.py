"""Conversions between wire sample formats and the internal format: mono float32 in [-1, 1].

Wire formats: PCM s16le (OpenAI Realtime ``pcm16``), f32le (Moshi raw PCM), and base64 of
either. Decoders validate and raise ``InvalidAudioError`` / ``InvalidBase64Error``.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np
import numpy.typing as npt

from rtserve.codecs.errors import InvalidAudioError, InvalidBase64Error

# The rate of every 24 kHz mono wire (OpenAI pcm16, Moshi, /v1/audio/speech) and of the
# reference engines: defined once, here, below every layer that uses it.
WIRE_SAMPLE_RATE = 24_000

FloatArray = npt.NDArray[np.float32]
Int16Array = npt.NDArray[np.int16]

# int16 -> float divides by 32768 and float -> int16 multiplies by 32768, so a
# PCM16 -> float -> PCM16 round trip is bit exact.
_PCM16_SCALE = 32768.0


def require_finite(samples: FloatArray) -> FloatArray:
    """Return ``samples`` unchanged, or raise if any value is NaN or infinite."""
    if not np.isfinite(samples).all():
        raise InvalidAudioError("audio contains NaN or infinite samples")
    return samples


def as_mono_float32(samples: npt.ArrayLike) -> FloatArray:
    """Coerce caller-supplied samples to a finite 1-D float32 array."""
    array = np.asarray(samples)
    if array.ndim != 1:
        raise InvalidAudioError(f"expected mono 1-D samples, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        # Integer arrays are almost always unscaled int16 samples: refuse rather than guess.
        raise InvalidAudioError(f"expected float samples in [-1, 1], got dtype {array.dtype}")
    return require_finite(array.astype(np.float32, copy=False))


def int16_to_float(samples: Int16Array) -> FloatArray:
    return samples.astype(np.float32) / np.float32(_PCM16_SCALE)


def float_to_int16(samples: FloatArray) -> Int16Array:
    """Scale, round and clip to int16 (values beyond [-1, 1] saturate instead of wrapping)."""
    scaled: FloatArray = np.rint(np.asarray(samples, dtype=np.float32) * np.float32(_PCM16_SCALE))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def pcm16_to_float(data: bytes) -> FloatArray:
    """Decode PCM s16le bytes to float32."""
    if len(data) % 2:
        raise InvalidAudioError(f"PCM16 audio must be a whole number of 2-byte samples, got {len(data)} bytes")
    return int16_to_float(np.frombuffer(data, dtype="<i2"))


def float_to_pcm16(samples: FloatArray) -> bytes:
    """Encode float32 samples as PCM s16le bytes, clipping to the int16 range."""
    return float_to_int16(samples).astype("<i2", copy=False).tobytes()


def f32le_to_float(data: bytes) -> FloatArray:
    """Decode little-endian float32 bytes; rejects partial samples and NaN/Inf."""
    if len(data) % 4:
        raise InvalidAudioError(f"f32le audio must be a whole number of 4-byte samples, got {len(data)} bytes")
    return require_finite(np.frombuffer(data, dtype="<f4").astype(np.float32))


def float_to_f32le(samples: FloatArray) -> bytes:
    return np.asarray(samples, dtype="<f4").tobytes()


def b64_decode(text: str | bytes) -> bytes:
    """Strict base64 decode (standard alphabet, padding required, no stray characters)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        # ValueError: a str with non-ASCII characters.
        raise InvalidBase64Error("audio payload is not valid base64") from exc


def b64_to_pcm16(text: str | bytes) -> bytes:
    """Decode a base64 PCM16 payload, checking it holds whole 2-byte samples."""
    data = b64_decode(text)
    if len(data) % 2:
        raise InvalidAudioError(f"PCM16 audio must be a whole number of 2-byte samples, got {len(data)} bytes")
    return data


def pcm16_to_b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
