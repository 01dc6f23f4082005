from __future__ import annotations

import numpy as np
import pytest

from rtserve.codecs.resample import StreamResampler, resample
from tests.codecs.signals import irregular_chunks, snr_db, speechlike

RATE_PAIRS = [(48000, 24000), (24000, 48000), (24000, 16000), (16000, 24000), (8000, 24000), (24000, 8000)]


def _stream(resampler: StreamResampler, x: np.ndarray, seed: int) -> np.ndarray:
    out = [resampler.process(chunk) for chunk in irregular_chunks(x, seed, max_size=3000)]
    return np.concatenate([*out, resampler.flush()])


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_chunked_stream_matches_one_shot(in_rate: int, out_rate: int) -> None:
    """Cut anywhere, the stream is the whole signal resampled (libsoxr's one-shot as the
    reference: another filter, so equal within its passband error, not to the sample)."""
    x = speechlike(in_rate, 1.0)
    expected = resample(x, in_rate, out_rate)
    streamed = _stream(StreamResampler(in_rate, out_rate), x, seed=in_rate + out_rate)
    assert len(expected) == len(streamed) == len(x) * out_rate // in_rate
    assert snr_db(expected, streamed) > 35


@pytest.mark.parametrize(
    ("in_rate", "out_rate", "chunk_ms"), [(48000, 24000, 80), (48000, 24000, 20), (24000, 16000, 20)]
)
def test_every_chunk_gives_its_own_output_at_once(in_rate: int, out_rate: int, chunk_ms: int) -> None:
    """After the first chunk, each chunk of input gives exactly its share of output: a lockstep
    engine fed 80 ms Opus pages gets whole frames, never a block held back for later."""
    size = in_rate * chunk_ms // 1000
    x = speechlike(in_rate, 1.0)[: in_rate // size * size]  # whole chunks
    resampler = StreamResampler(in_rate, out_rate)
    sizes = [len(resampler.process(x[i : i + size])) for i in range(0, len(x), size)]
    assert sizes[1:] == [out_rate * chunk_ms // 1000] * (len(sizes) - 1)
    assert out_rate * chunk_ms // 1000 - sizes[0] <= out_rate // 1000  # the filter's delay: under 1 ms


def test_flush_resets_the_stream_for_reuse() -> None:
    x = speechlike(48000, 0.5)
    resampler = StreamResampler(48000, 24000)
    first = _stream(resampler, x, seed=1)
    second = _stream(resampler, x, seed=2)
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize(
    ("in_rate", "out_rate", "freq"),
    [(48000, 24000, 1000.0), (24000, 48000, 9000.0), (8000, 24000, 3000.0), (24000, 16000, 7000.0)],
)
def test_in_band_tones_are_resampled_cleanly(in_rate: int, out_rate: int, freq: float) -> None:
    t_in = np.arange(in_rate) / in_rate
    t_out = np.arange(out_rate) / out_rate
    y = resample((0.5 * np.sin(2 * np.pi * freq * t_in)).astype(np.float32), in_rate, out_rate)
    ideal = 0.5 * np.sin(2 * np.pi * freq * t_out)
    edge = out_rate // 20  # skip the filter's start-up and tail
    assert snr_db(ideal[edge:-edge], y[edge:-edge]) > 90


def test_a_strided_view_resamples_like_its_copy() -> None:
    x = speechlike(48000, 0.2)
    view = np.repeat(x, 2)[::2]  # the samples of x, every other one of a larger buffer
    np.testing.assert_array_equal(StreamResampler(48000, 24000).process(view), StreamResampler(48000, 24000).process(x))


def test_equal_rates_are_the_identity() -> None:
    x = speechlike(24000, 0.1)
    resampler = StreamResampler(24000, 24000)
    np.testing.assert_array_equal(resampler.process(x), x)
    assert resampler.flush().size == 0
    np.testing.assert_array_equal(resample(x, 24000, 24000), x)


def test_bad_rates_are_rejected() -> None:
    with pytest.raises(ValueError):
        StreamResampler(0, 24000)
    with pytest.raises(ValueError):
        resample(np.zeros(10, np.float32), 24000, -1)
