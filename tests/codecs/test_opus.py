from __future__ import annotations

import av
import numpy as np
import pytest

from rtserve.codecs.errors import InvalidOpusError
from rtserve.codecs.opus import OpusDecoder, OpusEncoder
from tests.codecs.signals import best_lag, correlation, irregular_chunks, snr_db, speechlike

RATES = [24000, 48000]
FRAMES_MS = [20, 40, 60, 80]


def _round_trip(encoder: OpusEncoder, decoder: OpusDecoder, x: np.ndarray, seed: int = 0) -> np.ndarray:
    packets = [p for chunk in irregular_chunks(x, seed, max_size=2000) for p in encoder.encode(chunk)]
    packets += encoder.finish()
    return np.concatenate([*(decoder.decode(p) for p in packets), decoder.flush()])


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("frame_ms", FRAMES_MS)
def test_round_trip_snr_after_codec_delay(rate: int, frame_ms: int) -> None:
    x = speechlike(rate, 1.0)
    encoder = OpusEncoder(rate, frame_ms)
    y = _round_trip(encoder, OpusDecoder(rate), x)
    delay = encoder.pre_skip_48k * rate // 48000
    assert len(y) >= len(x) + delay  # finish() made every input sample decodable
    lag = best_lag(x, y, rate // 10)
    assert abs(lag - delay) <= 2
    # Measured 16.5-18 dB at the default 32 kbit/s "audio" application.
    assert snr_db(x, y, lag) > 12


def test_lower_complexity_still_codes_speech_well() -> None:
    x = speechlike(24000, 1.0)
    y = _round_trip(OpusEncoder(24000, 20, complexity=3), OpusDecoder(24000), x)
    assert snr_db(x, y, best_lag(x, y, 2400)) > 12


def test_long_digital_silence_stays_silent_and_speech_after_it_codes_well() -> None:
    # Seconds of exact zeros (an agent that listens, a muted microphone) between speech: the
    # encoder codes them as silence, and the speech after them as well as before.
    rate = 24000
    speech = speechlike(rate, 1.0)
    x = np.concatenate([speech, np.zeros(3 * rate, np.float32), speech])
    encoder = OpusEncoder(rate, 80, application="lowdelay", complexity=5)
    y = _round_trip(encoder, OpusDecoder(rate), x)
    delay = encoder.pre_skip_48k * rate // 48000
    silence = y[delay + len(speech) + rate // 5 : delay + len(speech) + 3 * rate - rate // 5]
    assert np.abs(silence).max() < 1e-4
    tail_start = len(speech) + 3 * rate
    tail = y[delay + tail_start : delay + tail_start + len(speech)]
    assert snr_db(speech, tail, 0) > 12


@pytest.mark.parametrize("rate", RATES)
def test_voip_application_keeps_the_waveform_shape(rate: int) -> None:
    x = speechlike(rate, 1.0)
    y = _round_trip(OpusEncoder(rate, 20, application="voip"), OpusDecoder(rate), x)
    # SILK is not waveform-matching (measured ~6 dB SNR) but stays highly correlated (~0.87).
    assert correlation(x, y, best_lag(x, y, rate // 10)) > 0.75


@pytest.mark.parametrize("rate", RATES)
def test_packets_do_not_depend_on_how_input_is_chunked(rate: int) -> None:
    x = speechlike(rate, 0.5)
    whole = OpusEncoder(rate, 20)
    chunked = OpusEncoder(rate, 20)
    expected = whole.encode(x) + whole.finish()
    got = [p for chunk in irregular_chunks(x, seed=3, max_size=500) for p in chunked.encode(chunk)]
    assert got + chunked.finish() == expected


def test_packets_come_out_only_for_complete_frames() -> None:
    encoder = OpusEncoder(24000, 20)
    assert encoder.encode(np.zeros(479, np.float32)) == []
    assert len(encoder.encode(np.zeros(1, np.float32))) == 1
    assert len(encoder.encode(np.zeros(480 * 3 + 10, np.float32))) == 3


@pytest.mark.parametrize("rate", RATES)
def test_80_ms_is_one_packet_of_four_20_ms_frames(rate: int) -> None:
    encoder = OpusEncoder(rate, 80)
    packets = encoder.encode(speechlike(rate, 0.08))
    assert len(packets) == 1
    toc, frame_count = packets[0][0], packets[0][1]
    assert toc & 0x3 == 3 and frame_count & 0x3F == 4  # RFC 6716 code-3 packet, 4 frames
    assert len(OpusDecoder(48000).decode(packets[0])) == 3840


def test_decoder_rejects_empty_and_garbage_packets_and_keeps_working() -> None:
    encoder = OpusEncoder(24000, 20)
    good = encoder.encode(speechlike(24000, 0.02))[0]
    decoder = OpusDecoder(48000)
    for bad in (b"", b"\xff" * 10, b"\x03\xff"):
        with pytest.raises(InvalidOpusError) as info:
            decoder.decode(bad)
        assert info.value.code == "invalid_opus"
    assert len(decoder.decode(good)) == 960


def test_stereo_packets_are_downmixed_to_mono() -> None:
    x = speechlike(48000, 0.2)
    ctx = av.CodecContext.create("libopus", "w")
    ctx.sample_rate, ctx.layout, ctx.format, ctx.bit_rate = 48000, "stereo", "flt", 96000
    ctx.options = {"application": "audio"}
    ctx.open()
    # Left = signal, right = silence: the downmix is half the signal.
    packets = []
    for start in range(0, len(x), 960):
        frame = av.AudioFrame.from_ndarray(
            np.stack([x[start : start + 960], np.zeros(960, np.float32)]).T.reshape(1, -1),
            format="flt",
            layout="stereo",
        )
        frame.sample_rate = 48000
        frame.pts = start
        packets += [bytes(p) for p in ctx.encode(frame)]
    decoder = OpusDecoder(48000, channels=2)
    y = np.concatenate([decoder.decode(p) for p in packets])
    lag = best_lag(x, y, 2000)
    assert snr_db(0.5 * x, y, lag) > 10


def test_invalid_parameters_are_programming_errors() -> None:
    with pytest.raises(ValueError):
        OpusEncoder(44100)
    with pytest.raises(ValueError):
        OpusEncoder(24000, frame_ms=30)
    with pytest.raises(ValueError):
        OpusEncoder(24000, bitrate=100)
    with pytest.raises(ValueError):
        OpusEncoder(24000, complexity=11)
    with pytest.raises(ValueError):
        OpusDecoder(24000, channels=3)
