"""Raw Ogg page construction for tests: arbitrary headers, lacing and CRC values."""

from __future__ import annotations

import struct

from rtserve.codecs.ogg import ogg_crc32


def raw_page(*, lacing: bytes, body: bytes, flags: int = 0, granule: int = 0, serial: int = 1,
             sequence: int = 0, version: int = 0, capture: bytes = b"OggS") -> bytes:
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
        size = 27 + segments + sum(stream[offset + 27:offset + 27 + segments])
        pages.append(stream[offset:offset + size])
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
