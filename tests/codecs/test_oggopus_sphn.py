"""Ogg-Opus interop with ``sphn``, the library Moshi's own server uses for its stream."""

from __future__ import annotations

import numpy as np
import pytest
import sphn

from rtserve.codecs.oggopus import OggOpusReader, OggOpusWriter, OpusHead
from tests.codecs.oggpages import split_pages
from tests.codecs.signals import best_lag, correlation, irregular_chunks, snr_db, speechlike


def _sphn_decode(stream: bytes, rate: int, seed: int) -> np.ndarray:
    reader = sphn.OpusStreamReader(rate)
    pieces = [reader.append_bytes(chunk) for chunk in irregular_chunks(stream, seed, max_size=300)]
    return np.concatenate([p for p in pieces if p is not None])


@pytest.mark.parametrize(("rate", "frame_ms"), [(24000, 20), (24000, 80), (48000, 20), (48000, 60)])
def test_sphn_reader_decodes_our_stream(rate: int, frame_ms: int) -> None:
    x = speechlike(rate, 1.0)
    writer = OggOpusWriter(rate, frame_ms)
    messages = [writer.write(chunk) for chunk in irregular_chunks(x, seed=1, max_size=1500)] + [writer.close()]
    stream = b"".join(messages)
    theirs = _sphn_decode(stream, rate, seed=2)
    # sphn ignores pre-skip, so its output lags the input by the codec delay.
    delay = OpusHead.parse(split_pages(stream)[0][28:]).pre_skip * rate // 48000
    assert abs(best_lag(x, theirs, rate // 10) - delay) <= 2
    assert snr_db(x, theirs, delay) > 12
    reader = OggOpusReader(rate)
    ours = np.concatenate([reader.feed(stream), reader.flush()])
    assert snr_db(ours, theirs, delay) > 30  # the two decoders agree


@pytest.mark.parametrize(
    ("rate", "frame_samples", "min_agreement_db"),
    [
        (24000, 1920, 30),  # Moshi's 80 ms frames; we decode at 48 kHz and resample, sphn decodes at 24 kHz
        (48000, 960, 100),  # same libopus at the same rate: bit-for-bit the same samples
    ],
)
def test_our_reader_decodes_the_sphn_stream(rate: int, frame_samples: int, min_agreement_db: float) -> None:
    x = speechlike(rate, 1.0)
    writer = sphn.OpusStreamWriter(rate)
    stream = b"".join(
        writer.append_pcm(x[i : i + frame_samples]) for i in range(0, len(x) - frame_samples + 1, frame_samples)
    )
    reader = OggOpusReader(rate)
    ours = np.concatenate([reader.feed(c) for c in irregular_chunks(stream, seed=3, max_size=300)] + [reader.flush()])
    theirs = sphn.OpusStreamReader(rate).append_bytes(stream)
    # We honour the OpusHead pre-skip (sphn writes 3840); sphn's reader does not.
    skip = OpusHead.parse(split_pages(stream)[0][28:]).pre_skip * rate // 48000
    assert len(ours) == len(theirs) - skip
    assert snr_db(theirs[skip:], ours) > min_agreement_db
    # sphn encodes with the VoIP (SILK) mode: shape-preserving, not waveform-matching.
    assert correlation(x, ours, best_lag(x, ours, rate // 5)) > 0.8
