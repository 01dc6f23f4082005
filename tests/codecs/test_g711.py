from __future__ import annotations

import av
import numpy as np
import pytest

from rtserve.codecs import g711
from tests.codecs.signals import snr_db, speechlike

FFMPEG_CODEC = {"ulaw": "pcm_mulaw", "alaw": "pcm_alaw"}
EVERY_INT16 = np.arange(-32768, 32768, dtype=np.int16)


def _ffmpeg_encode(law: g711.G711Law, samples: np.ndarray) -> np.ndarray:
    ctx = av.CodecContext.create(FFMPEG_CODEC[law], "w")
    assert isinstance(ctx, av.AudioCodecContext)
    ctx.sample_rate, ctx.layout, ctx.format = 8000, "mono", "s16"
    ctx.open()
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
    frame.sample_rate = 8000
    return np.frombuffer(b"".join(bytes(p) for p in ctx.encode(frame)), np.uint8)


def _ffmpeg_decode(law: g711.G711Law, data: bytes) -> np.ndarray:
    ctx = av.CodecContext.create(FFMPEG_CODEC[law], "r")
    assert isinstance(ctx, av.AudioCodecContext)
    ctx.sample_rate, ctx.layout = 8000, "mono"
    ctx.open()
    return np.concatenate([f.to_ndarray()[0] for f in ctx.decode(av.Packet(data))])


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_decoding_matches_ffmpeg_for_every_code(law: g711.G711Law) -> None:
    every_code = bytes(range(256))
    np.testing.assert_array_equal(g711.decode_int16(law, every_code), _ffmpeg_decode(law, every_code))


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_encoding_agrees_with_ffmpeg_except_at_g711_decision_levels(law: g711.G711Law) -> None:
    ours = np.frombuffer(g711.encode_int16(law, EVERY_INT16), np.uint8)
    theirs = _ffmpeg_encode(law, EVERY_INT16)
    differ = ours != theirs
    # FFmpeg quantises to the nearest level; G.711 puts the decision level at the segment
    # boundary, so the two differ only just above a few segment boundaries, by one level.
    assert differ.mean() < 0.02
    decoded_ours = g711.decode_int16(law, ours.tobytes()).astype(int)
    decoded_theirs = g711.decode_int16(law, theirs.tobytes()).astype(int)
    step = np.abs(decoded_ours - decoded_theirs)[differ]
    assert step.max() <= 1024
    assert np.all(np.abs(decoded_ours - EVERY_INT16) <= np.abs(decoded_theirs - EVERY_INT16) + 1024)


def test_ulaw_segment_boundaries_are_the_g711_decision_values() -> None:
    # G.711 mu-law segment edges in the 14-bit domain: 31, 95, 223, 479, 991, 2015, 4063.
    for segment, edge in enumerate([31, 95, 223, 479, 991, 2015, 4063]):
        codes = g711.encode_int16("ulaw", np.array([4 * edge - 4, 4 * edge], np.int16))
        below, at = ~np.frombuffer(codes, np.uint8)
        assert (below >> 4) & 7 == segment and (at >> 4) & 7 == segment + 1


def test_alaw_segment_boundaries_are_the_g711_decision_values() -> None:
    # G.711 A-law segment edges in the 13-bit domain are powers of two from 64 to 2048.
    for segment, edge in enumerate([64, 128, 256, 512, 1024, 2048], start=1):
        codes = g711.encode_int16("alaw", np.array([8 * edge - 8, 8 * edge], np.int16))
        below, at = np.frombuffer(codes, np.uint8) ^ 0xD5
        assert (below >> 4) & 7 == segment and (at >> 4) & 7 == segment + 1


@pytest.mark.parametrize(("law", "codes"), [("ulaw", [0xFF, 0x80, 0x00]), ("alaw", [0xD5, 0xAA, 0x2A])])
def test_silence_and_full_scale_codes(law: g711.G711Law, codes: list[int]) -> None:
    assert list(g711.encode_int16(law, np.array([0, 32767, -32768], np.int16))) == codes


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_speech_round_trip_snr_above_30_db(law: g711.G711Law) -> None:
    x = speechlike(8000, 2.0)
    data = g711.encode(law, x)
    assert len(data) == len(x)
    assert snr_db(x, g711.decode(law, data)) > 30


def test_unknown_law_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        g711.decode("mulaw", b"\x00")  # type: ignore[arg-type]  # deliberately no law: refused at run time
