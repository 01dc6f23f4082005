from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np
import pytest

from rtserve.codecs.errors import CodecError, InvalidAudioError, InvalidWavError, UnsupportedFormatError
from rtserve.codecs.wav import WavSampleFormat, read_wav, wav_frames, wav_header, write_wav
from tests.codecs.signals import snr_db, speechlike


def _stdlib_wav(samples: np.ndarray, rate: int, channels: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def _riff(*chunks: tuple[bytes, bytes]) -> bytes:
    body = b"".join(cid + struct.pack("<I", len(data)) + data + b"\x00" * (len(data) & 1) for cid, data in chunks)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def _fmt(tag: int, channels: int, rate: int, bits: int, extra: bytes = b"") -> bytes:
    align = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits) + extra


@pytest.mark.parametrize(("sample_format", "min_snr"), [("pcm16", 80), ("float32", 300)])
def test_round_trip(sample_format: WavSampleFormat, min_snr: float) -> None:
    x = speechlike(16000, 0.5)
    audio = read_wav(write_wav(x, 16000, sample_format))
    assert (audio.sample_rate, audio.channels, len(audio.samples)) == (16000, 1, len(x))
    assert snr_db(x, audio.samples) > min_snr


@pytest.mark.parametrize(("sample_format", "codec"), [("pcm16", "pcm_s16le"), ("float32", "pcm_f32le")])
def test_written_files_are_read_by_ffmpeg(sample_format: WavSampleFormat, codec: str) -> None:
    x = speechlike(24000, 0.25)
    with av.open(io.BytesIO(write_wav(x, 24000, sample_format))) as container:
        assert isinstance(container, av.container.InputContainer)
        stream = container.streams.audio[0]
        assert (stream.codec_context.name, stream.rate) == (codec, 24000)
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    scale = 32768.0 if sample_format == "pcm16" else 1.0
    assert snr_db(x, decoded / scale) > 80


def test_reads_stdlib_wave_output_and_downmixes_stereo() -> None:
    left = np.full(100, 1000, np.int16)
    right = np.full(100, 3000, np.int16)
    audio = read_wav(_stdlib_wav(np.stack([left, right], axis=1), 8000, channels=2))
    assert (audio.sample_rate, audio.channels) == (8000, 2)
    np.testing.assert_allclose(audio.samples, 2000 / 32768)


def test_reads_extensible_float_with_extra_chunks_and_odd_padding() -> None:
    samples = np.array([0.5, -0.25, 0.125], "<f4")
    guid_float = struct.pack("<H", 3) + bytes(14)
    fmt = _fmt(0xFFFE, 1, 44100, 32, struct.pack("<HHI", 22, 32, 4) + guid_float)
    data = _riff((b"LIST", b"odd"), (b"fmt ", fmt), (b"fact", struct.pack("<I", 3)), (b"data", samples.tobytes()))
    audio = read_wav(data)
    assert audio.sample_rate == 44100
    np.testing.assert_array_equal(audio.samples, samples)


def test_streamed_wav_with_unknown_length_reads_to_the_end() -> None:
    x = speechlike(24000, 0.1)
    data = wav_header(24000) + wav_frames(x) + b"\x01"  # trailing partial sample is dropped
    assert struct.unpack_from("<I", data, 40)[0] == 0xFFFFFFFF
    audio = read_wav(data)
    assert len(audio.samples) == len(x) and snr_db(x, audio.samples) > 80


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (b"", InvalidWavError, "not a RIFF"),
        (b"RIFF\x00\x00\x00\x00AVI ", InvalidWavError, "not a RIFF"),
        (b"RF64" + bytes(8), UnsupportedFormatError, "RF64"),
        (_riff((b"data", b"\x00\x00")), InvalidWavError, "before its fmt"),
        (_riff((b"fmt ", _fmt(1, 1, 8000, 16))), InvalidWavError, "no data chunk"),
        (_riff((b"LIST", b"abcd")), InvalidWavError, "no fmt chunk"),
        (_riff((b"fmt ", b"\x01\x00")), InvalidWavError, "truncated"),
        (_riff((b"fmt ", _fmt(1, 0, 8000, 16))), InvalidWavError, "zero channels"),
        (_riff((b"fmt ", _fmt(1, 1, 0, 16))), InvalidWavError, "sample rate"),
        (_riff((b"fmt ", _fmt(1, 1, 8000, 24))), UnsupportedFormatError, "24-bit"),
        (_riff((b"fmt ", _fmt(6, 1, 8000, 8))), UnsupportedFormatError, "format tag 6"),
        (_riff((b"fmt ", _fmt(0xFFFE, 1, 8000, 32))), InvalidWavError, "extensible"),
        (
            _riff((b"fmt ", _fmt(1, 2, 8000, 16)[:12] + struct.pack("<HH", 3, 16)), (b"data", b"")),
            InvalidWavError,
            "align",
        ),
    ],
)
def test_malformed_and_unsupported_files_raise_typed_errors(data: bytes, error: type[CodecError], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        read_wav(data)
    assert info.value.code in {"invalid_wav", "unsupported_format"}


def test_float_wav_with_nan_is_invalid_audio() -> None:
    data = _riff((b"fmt ", _fmt(3, 1, 8000, 32)), (b"data", np.array([0.0, np.nan], "<f4").tobytes()))
    with pytest.raises(InvalidAudioError):
        read_wav(data)
