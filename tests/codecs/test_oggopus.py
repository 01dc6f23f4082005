from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from rtserve.codecs.errors import AudioLimitError, InvalidOggError, InvalidOpusError, UnsupportedFormatError
from rtserve.codecs.ogg import FLAG_BOS, FLAG_CONTINUED, FLAG_EOS, OggPageReader
from rtserve.codecs.oggopus import OggOpusReader, OggOpusWriter, OpusHead, opus_tags_packet
from rtserve.codecs.opus import OpusEncoder
from tests.codecs.oggpages import lacing_for, raw_page, split_pages, with_fixed_crc
from tests.codecs.signals import best_lag, irregular_chunks, snr_db, speechlike


def _write(x: np.ndarray, rate: int = 24000, frame_ms: int = 20, chunk: int = 777, **options: Any) -> list[bytes]:
    writer = OggOpusWriter(rate, frame_ms, serial=99, **options)
    return [writer.write(x[i : i + chunk]) for i in range(0, len(x), chunk)] + [writer.close()]


def _read(stream: bytes, rate: int = 24000, seed: int = 0) -> np.ndarray:
    reader = OggOpusReader(rate)
    return np.concatenate([reader.feed(c) for c in irregular_chunks(stream, seed)] + [reader.flush()])


@pytest.mark.parametrize("rate", [24000, 48000])
@pytest.mark.parametrize("frame_ms", [20, 80])
def test_round_trip_is_sample_aligned_and_exact_length(rate: int, frame_ms: int) -> None:
    x = speechlike(rate, 1.0)
    y = _read(b"".join(_write(x, rate, frame_ms)), rate)
    # Pre-skip removes the codec delay and the EOS granule trims the padding.
    assert len(y) == len(x)
    assert abs(best_lag(x, y, rate // 10)) <= 1
    assert snr_db(x, y) > 12


@pytest.mark.parametrize("complexity", [0, 5])
def test_lower_complexity_streams_still_round_trip(complexity: int) -> None:
    # The /api/chat shape: 80 ms pages, CELT-only "lowdelay", the default bit rate.
    x = speechlike(24000, 1.0)
    options: dict[str, Any] = {"application": "lowdelay", "bitrate": 32000}
    stream = b"".join(_write(x, 24000, 80, complexity=complexity, **options))
    y = _read(stream)
    assert len(y) == len(x)
    assert abs(best_lag(x, y, 2400)) <= 1
    assert snr_db(x, y) > 12
    # The knob reaches libopus: the full-complexity encoding of the same audio differs.
    assert stream != b"".join(_write(x, 24000, 80, complexity=10, **options))


def test_writer_pages_follow_rfc_7845() -> None:
    x = speechlike(24000, 0.5)
    messages = _write(x, 24000, 20)
    pages = [p for m in messages for p in OggPageReader().feed(m)]
    head, tags, audio = pages[0], pages[1], pages[2:]
    assert head.bos and head.granule == 0 and not tags.bos and tags.granule == 0
    parsed = OpusHead.parse(head.segments()[0][0])
    assert parsed.channels == 1 and parsed.pre_skip == OpusEncoder(24000).pre_skip_48k == 312
    assert parsed.input_sample_rate == 24000
    assert tags.segments()[0][0].startswith(b"OpusTags")
    assert [p.sequence for p in pages] == list(range(len(pages)))
    assert {p.serial for p in pages} == {99}
    assert all(len(p.segments()) == 1 for p in audio)  # one packet per page: no waiting
    granules = [p.granule for p in audio]
    assert granules[:-1] == [960 * (i + 1) for i in range(len(audio) - 1)]  # 20 ms in 48 kHz units
    assert audio[-1].eos and not any(p.eos for p in pages[:-1])
    assert granules[-1] == 312 + len(x) * 2
    # Every message is whole pages, so each can be sent as one WebSocket message.
    for message in messages:
        reader = OggPageReader()
        reader.feed(message)
        assert reader.buffered_bytes == 0


def test_first_write_emits_headers_even_without_a_full_frame() -> None:
    writer = OggOpusWriter(24000, 80)
    first = writer.write(np.zeros(10, np.float32))
    pages = OggPageReader().feed(first)
    assert [p.sequence for p in pages] == [0, 1]
    assert writer.write(np.zeros(10, np.float32)) == b""


def test_chunking_of_the_byte_stream_does_not_change_the_pcm() -> None:
    stream = b"".join(_write(speechlike(24000, 0.6)))
    reference = _read(stream, seed=0)
    reader = OggOpusReader()
    whole = np.concatenate([reader.feed(stream), reader.flush()])
    np.testing.assert_array_equal(whole, reference)
    np.testing.assert_array_equal(_read(stream, seed=5), reference)


def test_reading_pages_then_decoding_them_is_feed_and_counts_the_packets() -> None:
    # The Moshi route reads a message's pages first and decodes small ones on the loop: the
    # two halves give feed's audio, and packets_ending tells how much work decoding is.
    messages = _write(speechlike(24000, 0.6), frame_ms=20)
    reference = OggOpusReader()
    split = OggOpusReader()
    for message in messages:
        pages = split.read_pages(message)
        assert sum(page.packets_ending for page in pages) == len(pages)  # one packet per page
        np.testing.assert_array_equal(split.decode(pages), reference.feed(message))
    flood = raw_page(lacing=b"\x01" * 255, body=b"\x08" * 255, serial=99, sequence=2)
    assert OggPageReader().feed(flood)[0].packets_ending == 255
    with pytest.raises(InvalidOggError):
        split.read_pages(b"this is not an Ogg page")
    with pytest.raises(InvalidOggError):  # a rejected stream stays rejected, whichever half is called
        split.decode([])


def test_pcm_comes_out_as_soon_as_each_page_completes() -> None:
    messages = _write(speechlike(48000, 0.5), rate=48000, frame_ms=20)
    reader = OggOpusReader(48000)  # 48 kHz: no resampler, so nothing is held back
    assert reader.feed(messages[0]).size == 0  # headers only: 777 samples are less than a frame
    pre_skip = 312
    for message in messages[1:-1]:
        decoded = len(OggPageReader().feed(message)) * 960
        expected = max(0, decoded - pre_skip)
        pre_skip = max(0, pre_skip - decoded)
        assert len(reader.feed(message)) == expected


def test_chained_streams_are_decoded_one_after_the_other() -> None:
    a, b = speechlike(24000, 0.3, seed=1), speechlike(24000, 0.4, seed=2)
    y = _read(b"".join(_write(a)) + b"".join(_write(b)))
    assert len(y) == len(a) + len(b)
    assert snr_db(b, y[len(a) :]) > 12


def test_multi_packet_pages_and_opus_tags_spanning_pages() -> None:
    encoder = OpusEncoder(24000, 20)
    x = speechlike(24000, 0.2)
    packets = encoder.encode(x) + encoder.finish()
    head = OpusHead(channels=1, pre_skip=encoder.pre_skip_48k, input_sample_rate=24000).to_bytes()
    tags = opus_tags_packet("v" * 600)  # longer than one 255-byte piece: split over two pages
    pages = [
        raw_page(lacing=lacing_for(len(head)), body=head, flags=FLAG_BOS, sequence=0),
        raw_page(lacing=lacing_for(510, last_continues=True), body=tags[:510], sequence=1),
        raw_page(lacing=lacing_for(len(tags) - 510), body=tags[510:], flags=FLAG_CONTINUED, sequence=2),
        raw_page(lacing=lacing_for(*map(len, packets[:3])), body=b"".join(packets[:3]), sequence=3, granule=2880),
        raw_page(
            lacing=lacing_for(*map(len, packets[3:])),
            body=b"".join(packets[3:]),
            sequence=4,
            flags=FLAG_EOS,
            granule=encoder.pre_skip_48k + len(x) * 2,
        ),
    ]
    y = _read(b"".join(pages))
    assert len(y) == len(x) and snr_db(x, y) > 12


def test_packet_split_across_pages_decodes_like_the_whole_packet() -> None:
    encoder = OpusEncoder(24000, 80, bitrate=64000)
    packets = encoder.encode(speechlike(24000, 0.16))
    big = packets[0]
    assert len(big) > 255  # 80 ms at 64 kbit/s
    head = OpusHead(channels=1, pre_skip=0, input_sample_rate=24000).to_bytes()
    tags = opus_tags_packet("t")
    common = [
        raw_page(lacing=lacing_for(len(head)), body=head, flags=FLAG_BOS, sequence=0),
        raw_page(lacing=lacing_for(len(tags)), body=tags, sequence=1),
    ]
    whole = [*common, raw_page(lacing=lacing_for(len(big)), body=big, sequence=2)]
    split = [
        *common,
        raw_page(lacing=lacing_for(255, last_continues=True), body=big[:255], sequence=2, granule=-1),
        raw_page(lacing=lacing_for(len(big) - 255), body=big[255:], sequence=3, flags=FLAG_CONTINUED),
    ]
    np.testing.assert_array_equal(_read(b"".join(split)), _read(b"".join(whole)))


def _pages_with_head(head: bytes, stream: bytes | None = None) -> bytes:
    pages = split_pages(stream or b"".join(_write(speechlike(24000, 0.2))))
    return raw_page(lacing=lacing_for(len(head)), body=head, flags=FLAG_BOS, serial=99) + b"".join(pages[1:])


def test_output_gain_from_the_header_is_applied() -> None:
    stream = b"".join(_write(speechlike(24000, 0.3)))
    head = OpusHead.parse(split_pages(stream)[0][28:])
    louder = OpusHead(head.channels, head.pre_skip, head.input_sample_rate, output_gain_q8=int(20 * np.log10(2) * 256))
    louder_pcm = _read(_pages_with_head(louder.to_bytes(), stream))
    np.testing.assert_allclose(louder_pcm, 2 * _read(stream), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize(
    ("head", "error", "message"),
    [
        (b"OpusHeaX" + bytes(11), InvalidOggError, "not an OpusHead"),
        (b"OpusHead\x01\x01", InvalidOggError, "truncated"),
        (struct.pack("<8sBBHIhB", b"OpusHead", 0x10, 1, 312, 24000, 0, 0), UnsupportedFormatError, "version"),
        (
            struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, 312, 24000, 0, 1) + b"\x01\x00\x00",
            UnsupportedFormatError,
            "mapping",
        ),
        (struct.pack("<8sBBHIhB", b"OpusHead", 1, 3, 312, 24000, 0, 0), InvalidOggError, "channel count"),
    ],
)
def test_bad_opus_head_is_rejected(head: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        OggOpusReader().feed(_pages_with_head(head))


def _mutate_page(stream: bytes, index: int, **fields: object) -> bytes:
    pages = split_pages(stream)
    page = pages[index]
    flags, granule, serial, sequence = struct.unpack_from("<BqII", page, 5)
    values = {"flags": flags, "granule": granule, "serial": serial, "sequence": sequence} | fields
    header = page[:5] + struct.pack("<BqII", values["flags"], values["granule"], values["serial"], values["sequence"])
    pages[index] = with_fixed_crc(header + page[22:])
    return b"".join(pages)


STREAM = b"".join(_write(speechlike(24000, 0.3)))


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (split_pages(STREAM)[1], "must start with a BOS"),
        (_mutate_page(STREAM, 3, sequence=9), "expected 3"),
        (_mutate_page(STREAM, 3, serial=5), "multiplexed"),
        (_mutate_page(STREAM, 3, flags=FLAG_BOS), "BOS page in the middle"),
        (_mutate_page(STREAM, 3, flags=FLAG_CONTINUED), "continuation"),
        (_mutate_page(STREAM, 0, flags=FLAG_BOS | FLAG_EOS), "ended on its BOS"),
        (
            split_pages(STREAM)[0] + raw_page(lacing=b"", body=b"", flags=FLAG_EOS, serial=99, sequence=1),
            "before its OpusTags",
        ),
        (
            b"".join(split_pages(STREAM)[:1]) + raw_page(lacing=b"\x08", body=b"NotTags!", serial=99, sequence=1),
            "OpusTags",
        ),
    ],
)
def test_stream_structure_errors_are_rejected(stream: bytes, message: str) -> None:
    reader = OggOpusReader()
    with pytest.raises(InvalidOggError, match=message) as info:
        reader.feed(stream)
    assert info.value.code == "invalid_ogg"
    with pytest.raises(InvalidOggError, match="already rejected"):
        reader.feed(b"")


def test_undecodable_opus_packet_is_an_opus_error() -> None:
    pages = split_pages(STREAM)
    bad = raw_page(lacing=b"\x02", body=b"\x03\xff", serial=99, sequence=2)
    with pytest.raises(InvalidOpusError):
        OggOpusReader().feed(b"".join(pages[:2]) + bad)


def test_oversized_packet_is_rejected_before_it_is_buffered() -> None:
    pages = split_pages(STREAM)
    opened = raw_page(lacing=b"\xff" * 10, body=b"p" * 2550, serial=99, sequence=2)
    with pytest.raises(InvalidOggError, match="byte limit"):
        OggOpusReader(max_packet_bytes=2000).feed(b"".join(pages[:2]) + opened)


def test_tiny_packets_cannot_decode_into_unbounded_audio() -> None:
    # 1-byte packets each decode to a 20 ms concealment frame: a cheap amplification attack.
    pages = split_pages(STREAM)
    flood = raw_page(lacing=b"\x01" * 255, body=b"\x08" * 255, serial=99, sequence=2)
    with pytest.raises(AudioLimitError) as info:
        OggOpusReader(max_feed_seconds=1.0).feed(b"".join(pages[:2]) + flood)
    assert info.value.code == "audio_limit_exceeded"


def test_truncated_stream_just_waits_for_more_bytes() -> None:
    reader = OggOpusReader()
    cut = len(STREAM) // 2
    first = reader.feed(STREAM[:cut])
    rest = reader.feed(STREAM[cut:])
    assert len(first) + len(rest) == int(0.3 * 24000)
