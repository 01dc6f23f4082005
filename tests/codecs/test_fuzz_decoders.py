"""Property tests: every decoder, fed random, truncated or mutated bytes, either returns
or raises a ``CodecError``; nothing else escapes. The per-test timeout bounds the time a
call may take, so a decoder that loops forever fails instead of hanging the suite."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
import sphn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtserve.codecs import g711
from rtserve.codecs.errors import CodecError
from rtserve.codecs.oggopus import OggOpusReader, OggOpusWriter
from rtserve.codecs.opus import OpusDecoder, OpusEncoder
from rtserve.codecs.pcm import b64_to_pcm16, f32le_to_float, pcm16_to_float
from rtserve.codecs.wav import read_wav, write_wav
from tests.codecs.oggpages import with_fixed_crc
from tests.codecs.signals import speechlike

pytestmark = pytest.mark.timeout(120)
FUZZ = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])

_X = speechlike(24000, 0.25)
_writer = OggOpusWriter(24000, 20)
OUR_STREAM = _writer.write(_X) + _writer.close()
_sphn_writer = sphn.OpusStreamWriter(24000)
SPHN_STREAM = b"".join(_sphn_writer.append_pcm(_X[i : i + 1920]) for i in range(0, 4 * 1920, 1920))
_encoder = OpusEncoder(24000, 20)
GOOD_PACKET = _encoder.encode(_X[:480])[0]
WAV_FILES = [write_wav(_X[:2000], 24000, "pcm16"), write_wav(_X[:2000], 24000, "float32")]
T = TypeVar("T")


def only_codec_errors(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except CodecError:
        return None


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    mutable = bytearray(data)
    for position, value in edits:
        mutable[position % len(mutable)] = value
    return bytes(mutable)


def _fix_crcs(stream: bytes) -> bytes:
    """Recompute the CRC of every page still recognisable, so mutations reach the parser."""
    out = bytearray()
    offset = 0
    while offset + 27 <= len(stream) and stream[offset : offset + 4] == b"OggS":
        segments = stream[offset + 26]
        size = 27 + segments + sum(stream[offset + 27 : offset + 27 + segments])
        if offset + size > len(stream):
            break
        out += with_fixed_crc(stream[offset : offset + size])
        offset += size
    return bytes(out + stream[offset:])


def _feed_in_chunks(reader: OggOpusReader, data: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        reader.feed(data[start:end])
    reader.flush()


edits = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
cuts = st.lists(st.integers(0, 1 << 20), max_size=8)


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_base64_pcm16(payload: str | bytes) -> None:
    only_codec_errors(lambda: b64_to_pcm16(payload))


@FUZZ
@given(st.binary(max_size=400))
def test_raw_pcm(data: bytes) -> None:
    only_codec_errors(lambda: pcm16_to_float(data))
    only_codec_errors(lambda: f32le_to_float(data))


@FUZZ
@given(st.binary(max_size=400), st.sampled_from(["ulaw", "alaw"]))
def test_g711_decoding_is_total(data: bytes, law: g711.G711Law) -> None:
    decoded = g711.decode(law, data)
    assert len(decoded) == len(data) and np.all(np.abs(decoded) <= 1.0)


@FUZZ
@given(st.one_of(st.binary(max_size=1500), edits.map(lambda e: _mutate(GOOD_PACKET, e))))
def test_opus_decoder(packet: bytes) -> None:
    decoder = OpusDecoder(48000)
    output = only_codec_errors(lambda: decoder.decode(packet))
    if output is not None:
        assert len(output) <= 5760  # at most 120 ms per packet
    assert len(decoder.decode(GOOD_PACKET)) == 960  # an error never wedges the decoder


@FUZZ
@given(st.binary(max_size=3000), cuts)
def test_ogg_reader_random_bytes(data: bytes, chunk_cuts: list[int]) -> None:
    only_codec_errors(lambda: _feed_in_chunks(OggOpusReader(), data, chunk_cuts))


@FUZZ
@given(st.sampled_from([OUR_STREAM, SPHN_STREAM]), st.integers(0, 1 << 20), st.binary(max_size=64), cuts)
def test_ogg_reader_truncated_streams(stream: bytes, cut: int, tail: bytes, chunk_cuts: list[int]) -> None:
    truncated = stream[: cut % (len(stream) + 1)] + tail
    only_codec_errors(lambda: _feed_in_chunks(OggOpusReader(), truncated, chunk_cuts))


@FUZZ
@given(st.sampled_from([OUR_STREAM, SPHN_STREAM]), edits, st.booleans(), cuts)
def test_ogg_reader_mutated_streams(
    stream: bytes, changes: list[tuple[int, int]], fix_crc: bool, chunk_cuts: list[int]
) -> None:
    mutated = _mutate(stream, changes)
    if fix_crc:
        mutated = _fix_crcs(mutated)
    reader = OggOpusReader(max_feed_seconds=5.0)
    only_codec_errors(lambda: _feed_in_chunks(reader, mutated, chunk_cuts))


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=400),
        st.tuples(st.sampled_from(WAV_FILES), edits).map(lambda pair: _mutate(pair[0][:64], pair[1]) + pair[0][64:]),
        st.tuples(st.sampled_from(WAV_FILES), st.integers(0, 5000)).map(lambda pair: pair[0][: pair[1]]),
    )
)
def test_wav_reader(data: bytes) -> None:
    audio = only_codec_errors(lambda: read_wav(data))
    if audio is not None:
        assert len(audio.samples) <= len(data)
