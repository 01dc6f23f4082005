"""G.711 mu-law and A-law (ITU-T G.711), 8-bit companded telephony audio at 8 kHz.

Both directions are table lookups: the decode tables have 256 entries, the encode tables
65536 (one per int16 value), all built once with vectorised numpy from the G.711
segment/mantissa definition. Every byte is a valid code, so decoding is total.
The float helpers resample nothing: callers convert to and from 8 kHz themselves.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from rtserve.codecs.pcm import FloatArray, Int16Array, as_mono_float32, float_to_int16, int16_to_float

G711Law = Literal["ulaw", "alaw"]

_ULAW_BIAS = 0x84  # 132 in 16-bit units, 33 in the 14-bit domain the encoder works in.
_ULAW_CLIP_14BIT = 8159


def _bit_length(values: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Number of significant bits of non-negative ints (0 for 0)."""
    return np.where(values > 0, np.floor(np.log2(np.maximum(values, 1))).astype(np.int32) + 1, 0)


def _ulaw_decode_table() -> Int16Array:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (code >> 4) & 0x7
    mantissa = code & 0xF
    magnitude = (((mantissa << 3) + _ULAW_BIAS) << exponent) - _ULAW_BIAS
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _ulaw_encode_table() -> npt.NDArray[np.uint8]:
    linear = np.arange(-32768, 32768, dtype=np.int32) >> 2  # 14-bit signed
    negative = linear < 0
    # The bias makes every segment boundary a power of two; 8191 saturates to the top code.
    biased = np.minimum(np.minimum(np.abs(linear), _ULAW_CLIP_14BIT) + (_ULAW_BIAS >> 2), 8191)
    exponent = _bit_length(biased) - 6
    mantissa = (biased >> (exponent + 1)) & 0xF
    code = ~((exponent << 4) | mantissa) & 0x7F
    code = np.where(negative, code, code | 0x80)
    return np.roll(code.astype(np.uint8), -32768)  # index by the int16 bit pattern (uint16 view)


def _alaw_decode_table() -> Int16Array:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (code >> 4) & 0x7
    mantissa = code & 0xF
    magnitude = np.where(
        exponent == 0,
        (mantissa << 4) + 8,
        ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0),
    )
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


def _alaw_encode_table() -> npt.NDArray[np.uint8]:
    linear = np.arange(-32768, 32768, dtype=np.int32) >> 3  # 13-bit signed
    negative = linear < 0
    magnitude = np.where(negative, -linear - 1, linear)  # one's complement for negatives
    exponent = np.maximum(_bit_length(magnitude) - 5, 0)
    mantissa = (magnitude >> np.maximum(exponent, 1)) & 0xF
    code = (exponent << 4) | mantissa
    code = np.where(negative, code ^ 0x55, code ^ 0xD5)
    return np.roll(code.astype(np.uint8), -32768)


_DECODE: dict[str, Int16Array] = {"ulaw": _ulaw_decode_table(), "alaw": _alaw_decode_table()}
_ENCODE: dict[str, npt.NDArray[np.uint8]] = {"ulaw": _ulaw_encode_table(), "alaw": _alaw_encode_table()}


def _check_law(law: str) -> None:
    if law not in _DECODE:
        raise ValueError(f"unknown G.711 law {law!r}; expected 'ulaw' or 'alaw'")


def encode_int16(law: G711Law, samples: Int16Array) -> bytes:
    """Compand int16 samples to one G.711 byte each."""
    _check_law(law)
    return _ENCODE[law][np.asarray(samples, dtype=np.int16).view(np.uint16)].tobytes()


def decode_int16(law: G711Law, data: bytes) -> Int16Array:
    """Expand G.711 bytes to int16 samples (total: every byte is a valid code)."""
    _check_law(law)
    return _DECODE[law][np.frombuffer(data, dtype=np.uint8)]


def encode(law: G711Law, samples: FloatArray) -> bytes:
    """Float32 samples (already at 8 kHz) -> G.711 bytes."""
    return encode_int16(law, float_to_int16(as_mono_float32(samples)))


def decode(law: G711Law, data: bytes) -> FloatArray:
    """G.711 bytes -> float32 samples at 8 kHz."""
    return int16_to_float(decode_int16(law, data))
