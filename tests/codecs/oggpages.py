"""Raw Ogg page construction for tests: arbitrary headers, lacing and CRC values."""

from __future__ import annotations

import struct

from rtserve.codecs.ogg import FLAG_BOS, build_page, ogg_crc32
from rtserve.codecs.oggopus import OpusHead, opus_tags_packet


def raw_page(
    *,
    lacing: bytes,
    body: bytes,
    flags: int = 0,
    granule: int = 0,
    serial: int = 1,
    sequence: int = 0,
    version: int = 0,
    capture: bytes = b"OggS",
) -> bytes:
    """A page with exactly these fields and a correct CRC."""
    header = struct.pack("<4sBBqIIIB", capture, version, flags, granule, serial, sequence, 0, len(lacing))
    return with_fixed_crc(header + lacing + body)


def with_fixed_crc(page: bytes) -> bytes:
    zeroed = page[:22] + b"\x00\x00\x00\x00" + page[26:]
    return zeroed[:22] + struct.pack("<I", ogg_crc32(zeroed)) + zeroed[26:]


def split_pages(stream: bytes) -> list[bytes]:
    """Cut a well-formed stream into its pages."""
    pages = []
    offset = 0
    while offset < len(stream):
        segments = stream[offset + 26]
        size = 27 + segments + sum(stream[offset + 27 : offset + 27 + segments])
        pages.append(stream[offset : offset + size])
        offset += size
    return pages


def lacing_for(*lengths: int, last_continues: bool = False) -> bytes:
    """Lacing values for packets of these lengths; optionally leave the last one open."""
    lacing = bytearray()
    for index, length in enumerate(lengths):
        full, rest = divmod(length, 255)
        lacing += b"\xff" * full
        if not (last_continues and index == len(lengths) - 1):
            lacing.append(rest)
        elif rest:
            raise ValueError("an open packet piece must be a multiple of 255 bytes")
    return bytes(lacing)


# Opus TOC 0xFB: CELT fullband 20 ms frames, code 3; count byte 6 -> six empty frames. Two bytes
# that decode to 120 ms: the smallest packet of the most audio.
AMPLIFYING_PACKET = bytes((0xFB, 6))
AMPLIFYING_PACKET_S = 0.12


def amplifying_stream(pages: int, packets_per_page: int, serial: int = 7) -> list[bytes]:
    """A valid mono Ogg-Opus stream: head, tags, then ``pages`` small pages each of
    ``packets_per_page`` x 120 ms (255 packets: ~800 bytes that decode to 30.6 s)."""
    stream = [
        build_page(serial=serial, sequence=0, granule=0, packets=[OpusHead(1, 0, 24000).to_bytes()], flags=FLAG_BOS),
        build_page(serial=serial, sequence=1, granule=0, packets=[opus_tags_packet("test")]),
    ]
    stream += [
        build_page(serial=serial, sequence=2 + index, granule=0, packets=[AMPLIFYING_PACKET] * packets_per_page)
        for index in range(pages)
    ]
    return stream
