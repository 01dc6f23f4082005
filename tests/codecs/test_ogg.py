from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserve.codecs.errors import InvalidOggError
from rtserve.codecs.ogg import FLAG_BOS, FLAG_CONTINUED, FLAG_EOS, MAX_PAGE_BYTES, OggPageReader, build_page, ogg_crc32
from tests.codecs.oggpages import lacing_for, raw_page
from tests.codecs.signals import irregular_chunks


def _reference_crc(data: bytes) -> int:
    """Bit-at-a-time CRC-32 as RFC 3533 defines it (poly 0x04C11DB7, MSB first, init 0)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


@settings(max_examples=50)
@given(st.binary(max_size=300))
def test_crc_matches_the_rfc_3533_definition(data: bytes) -> None:
    assert ogg_crc32(data) == _reference_crc(data)


def test_pages_round_trip_through_any_chunking() -> None:
    packets = [b"a" * 10, b"b" * 255, b"", b"c" * 510, b"d" * 300]
    stream = (
        build_page(serial=7, sequence=0, granule=0, packets=[b"head"], flags=FLAG_BOS)
        + build_page(serial=7, sequence=1, granule=1234, packets=packets)
        + build_page(serial=7, sequence=2, granule=-1, packets=[], flags=FLAG_EOS)
    )
    for seed in range(5):
        reader = OggPageReader()
        pages = [page for chunk in irregular_chunks(stream, seed, max_size=40) for page in reader.feed(chunk)]
        assert [(p.bos, p.eos, p.serial, p.sequence, p.granule) for p in pages] == [
            (True, False, 7, 0, 0),
            (False, False, 7, 1, 1234),
            (False, True, 7, 2, -1),
        ]
        assert pages[1].segments() == [(packet, True) for packet in packets]
        assert pages[2].segments() == []
        assert reader.buffered_bytes == 0


def test_a_packet_spanning_pages_is_reported_open_then_continued() -> None:
    first = raw_page(lacing=lacing_for(5, 510, last_continues=True), body=b"x" * 5 + b"y" * 510)
    second = raw_page(lacing=lacing_for(20), body=b"y" * 20, flags=FLAG_CONTINUED, sequence=1)
    pages = OggPageReader().feed(first + second)
    assert pages[0].segments() == [(b"x" * 5, True), (b"y" * 510, False)]
    assert pages[1].continued and pages[1].segments() == [(b"y" * 20, True)]


def test_build_page_refuses_packets_that_do_not_fit() -> None:
    with pytest.raises(ValueError):
        build_page(serial=1, sequence=0, granule=0, packets=[b"z" * 255 * 255])


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (raw_page(lacing=b"\x01", body=b"a", capture=b"OggX"), "capture pattern"),
        (raw_page(lacing=b"\x01", body=b"a", version=1), "version"),
        (raw_page(lacing=b"\x01", body=b"a", flags=0x08), "reserved"),
        (raw_page(lacing=b"\x01", body=b"a")[:-1] + b"b", "CRC"),
    ],
)
def test_malformed_pages_are_rejected_and_the_reader_stays_failed(page: bytes, message: str) -> None:
    reader = OggPageReader()
    with pytest.raises(InvalidOggError, match=message) as info:
        reader.feed(page)
    assert info.value.code == "invalid_ogg"
    with pytest.raises(InvalidOggError, match="already rejected"):
        reader.feed(raw_page(lacing=b"\x01", body=b"a"))


def test_garbage_fails_on_the_first_bytes_without_waiting_for_a_header() -> None:
    with pytest.raises(InvalidOggError):
        OggPageReader().feed(b"Og\x00")


def test_oversized_page_is_rejected_from_its_header_alone() -> None:
    reader = OggPageReader(max_page_bytes=4096)
    header_and_lacing = raw_page(lacing=b"\xff" * 20, body=b"q" * 255 * 20)[: 27 + 20]
    with pytest.raises(InvalidOggError, match="exceeds"):
        reader.feed(header_and_lacing)


def test_buffering_never_exceeds_one_page() -> None:
    reader = OggPageReader()
    page = raw_page(lacing=b"\xff" * 255, body=b"r" * 255 * 255)
    assert len(page) == MAX_PAGE_BYTES
    for chunk in irregular_chunks(page[:-1], seed=0, max_size=9000):
        assert reader.feed(chunk) == []
        assert reader.buffered_bytes < MAX_PAGE_BYTES
    assert len(reader.feed(page[-1:])) == 1
    assert reader.buffered_bytes == 0


def test_max_page_bytes_must_be_within_the_format_bounds() -> None:
    with pytest.raises(ValueError):
        OggPageReader(max_page_bytes=MAX_PAGE_BYTES + 1)
    with pytest.raises(ValueError):
        OggPageReader(max_page_bytes=100)
