from __future__ import annotations

import base64

import numpy as np
import pytest

from rtserve.codecs.errors import CodecError, InvalidAudioError, InvalidBase64Error
from rtserve.codecs.pcm import (
    as_mono_float32,
    b64_to_pcm16,
    f32le_to_float,
    float_to_f32le,
    float_to_pcm16,
    pcm16_to_b64,
    pcm16_to_float,
)
from tests.codecs.signals import snr_db, speechlike


def test_every_int16_value_survives_pcm16_float_pcm16_exactly() -> None:
    every = np.arange(-32768, 32768, dtype="<i2").tobytes()
    assert float_to_pcm16(pcm16_to_float(every)) == every


def test_float_through_pcm16_keeps_more_than_80_db_snr() -> None:
    x = speechlike(24000, 1.0)
    assert snr_db(x, pcm16_to_float(float_to_pcm16(x))) > 80


def test_pcm16_conversion_clips_instead_of_wrapping() -> None:
    out = np.frombuffer(float_to_pcm16(np.array([1.5, -1.5, 1.0, -1.0, 0.5], np.float32)), "<i2")
    assert out.tolist() == [32767, -32768, 32767, -32768, 16384]


def test_pcm16_odd_byte_count_is_a_typed_error() -> None:
    with pytest.raises(InvalidAudioError) as info:
        pcm16_to_float(b"\x00\x01\x02")
    assert info.value.code == "invalid_audio"
    assert isinstance(info.value, ValueError)


def test_f32le_round_trip_is_exact_and_rejects_partial_samples() -> None:
    x = speechlike(16000, 0.2)
    assert np.array_equal(f32le_to_float(float_to_f32le(x)), x)
    with pytest.raises(InvalidAudioError):
        f32le_to_float(b"\x00" * 7)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_float_input_is_rejected(bad: float) -> None:
    with pytest.raises(InvalidAudioError, match="NaN or infinite"):
        f32le_to_float(np.array([0.0, bad], "<f4").tobytes())
    with pytest.raises(InvalidAudioError):
        as_mono_float32(np.array([0.1, bad]))


def test_as_mono_float32_rejects_multichannel_and_integer_arrays() -> None:
    with pytest.raises(InvalidAudioError, match="1-D"):
        as_mono_float32(np.zeros((2, 10), np.float32))
    with pytest.raises(InvalidAudioError, match="float"):
        as_mono_float32(np.zeros(10, np.int16))


def test_base64_pcm16_round_trip() -> None:
    pcm = float_to_pcm16(speechlike(24000, 0.1))
    assert b64_to_pcm16(pcm16_to_b64(pcm)) == pcm
    assert b64_to_pcm16(pcm16_to_b64(pcm).encode()) == pcm


@pytest.mark.parametrize("bad", ["AAA", "AA=A", "AAAA!", "AA AA", "AAAA\n", "ÄÄÄÄ", b"\xff\xfe"])
def test_malformed_base64_is_a_typed_error(bad: str | bytes) -> None:
    with pytest.raises(InvalidBase64Error) as info:
        b64_to_pcm16(bad)
    assert info.value.code == "invalid_base64"
    assert isinstance(info.value, CodecError)


def test_base64_with_odd_byte_count_is_rejected() -> None:
    with pytest.raises(InvalidAudioError, match="2-byte"):
        b64_to_pcm16(base64.b64encode(b"\x01\x02\x03"))
