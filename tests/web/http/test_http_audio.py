"""Speech encoders and upload decoding of the HTTP routes (rtserve/web/http_audio.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserve.codecs.errors import AudioLimitError, CodecError
from rtserve.web.http.audio import (
    SPEECH_SAMPLE_RATE,
    SpeechFormat,
    decode_audio,
    open_speech_encoder,
    wav_stream_header,
)
from tests.web.http_support import tone


def encode_in_chunks(response_format: SpeechFormat, pcm: np.ndarray, chunk: int) -> list[bytes]:
    encoder = open_speech_encoder(response_format)
    parts = [encoder.encode(pcm[i : i + chunk]) for i in range(0, pcm.size, chunk)]
    return [*parts, encoder.finish()]


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_encoders_emit_bytes_before_the_end_of_the_stream(response_format):
    parts = encode_in_chunks(response_format, tone(440, 2.0, SPEECH_SAMPLE_RATE), 4800)
    # Streaming means the first 0.2 s chunk already produced output, not only finish().
    assert parts[0]
    assert sum(len(p) for p in parts[:-1]) > len(parts[-1])


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav"])
def test_encoded_files_decode_back_to_the_signal(response_format):
    data = b"".join(encode_in_chunks(response_format, tone(440, 1.0, SPEECH_SAMPLE_RATE), 1000))
    decoded = decode_audio(io.BytesIO(data), 16000, max_seconds=10)
    assert abs(decoded.size / 16000 - 1.0) < 0.09
    spectrum = np.abs(np.fft.rfft(decoded[:16000]))
    assert abs(np.argmax(spectrum) * 16000 / min(decoded.size, 16000) - 440) < 5


def test_wav_header_declares_unknown_length():
    header = wav_stream_header(24000)
    assert len(header) == 44
    assert header[4:8] == header[40:44] == b"\xff\xff\xff\xff"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, width=32), max_size=400), st.integers(1, 64))
def test_pcm_encoder_is_chunking_invariant(samples, chunk):
    pcm = np.array(samples, dtype=np.float32)
    whole = b"".join(encode_in_chunks("pcm", pcm, max(pcm.size, 1)))
    assert b"".join(encode_in_chunks("pcm", pcm, chunk)) == whole
    assert len(whole) == 2 * pcm.size


def test_decoding_stops_at_the_length_limit():
    data = b"".join(encode_in_chunks("flac", tone(440, 3.0, SPEECH_SAMPLE_RATE), 24000))
    with pytest.raises(AudioLimitError, match="2 s limit"):
        decode_audio(io.BytesIO(data), 16000, max_seconds=2)


@given(st.binary(max_size=2048))
@settings(max_examples=40, deadline=None)
def test_arbitrary_bytes_decode_or_fail_with_a_typed_error(data):
    try:
        audio = decode_audio(io.BytesIO(data), 16000, max_seconds=5)
    except CodecError:
        return
    assert audio.dtype == np.float32 and np.isfinite(audio).all()
