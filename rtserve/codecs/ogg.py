"""Ogg page framing (RFC 3533), written by hand for incremental use.

Why hand-written: PyAV/FFmpeg's Ogg (de)muxer works on whole files or blocking I/O, and
no maintained Python library reads and writes Ogg pages incrementally from byte chunks
that arrive over a WebSocket. The format is small: a 27-byte header, a segment table of
lacing values, the body, and a CRC-32 (polynomial 0x04C11DB7, not reflected, initial
value 0, no final xor) over the page with its CRC field zeroed.

``OggPageReader`` turns arbitrary byte chunks into validated ``OggPage`` objects and
never buffers more than one page. ``build_page`` serialises complete packets into one page.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from rtserve.codecs.errors import InvalidOggError

CAPTURE_PATTERN = b"OggS"
HEADER_BYTES = 27
MAX_SEGMENTS = 255
MAX_PAGE_BYTES = HEADER_BYTES + MAX_SEGMENTS + MAX_SEGMENTS * 255  # 65307: the format's own bound

FLAG_CONTINUED = 0x01
FLAG_BOS = 0x02
FLAG_EOS = 0x04
_KNOWN_FLAGS = FLAG_CONTINUED | FLAG_BOS | FLAG_EOS

# capture, version, flags, granule (signed: -1 = no packet ends here), serial, sequence, crc, segments
_HEADER = struct.Struct("<4sBBqIIIB")
_CRC_OFFSET = 22

# Ogg's CRC is the bit-reflected twin of zlib's CRC-32: reflect every input byte, run zlib's
# CRC with a zero register (zlib xors the given start value with 0xFFFFFFFF), undo zlib's
# final xor and reflect the 32-bit result. This keeps the per-byte loop in C.
_REFLECT_BYTE = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc32(data: bytes) -> int:
    crc = zlib.crc32(data.translate(_REFLECT_BYTE), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{crc:032b}"[::-1], 2)


@dataclass(frozen=True, slots=True)
class OggPage:
    flags: int
    granule: int
    serial: int
    sequence: int
    lacing: bytes
    body: bytes

    @property
    def continued(self) -> bool:
        return bool(self.flags & FLAG_CONTINUED)

    @property
    def bos(self) -> bool:
        return bool(self.flags & FLAG_BOS)

    @property
    def eos(self) -> bool:
        return bool(self.flags & FLAG_EOS)

    @property
    def packets_ending(self) -> int:
        """Packets that end on this page (lacing values below 255)."""
        return sum(value < 255 for value in self.lacing)

    def segments(self) -> list[tuple[bytes, bool]]:
        """Split the body into packet pieces: ``(data, ends_here)``. Only the last piece can
        have ``ends_here == False`` (its packet continues on the next page)."""
        pieces: list[tuple[bytes, bool]] = []
        start = end = 0
        for value in self.lacing:
            end += value
            if value < 255:
                pieces.append((self.body[start:end], True))
                start = end
        if start < end:  # the page ended on a 255 lacing value: the packet goes on
            pieces.append((self.body[start:end], False))
        return pieces


def build_page(*, serial: int, sequence: int, granule: int, packets: Sequence[bytes], flags: int = 0) -> bytes:
    """Serialise complete ``packets`` as one page (they must fit in 255 lacing values)."""
    lacing = bytearray()
    for packet in packets:
        full, rest = divmod(len(packet), 255)
        lacing += b"\xff" * full + bytes((rest,))
    if len(lacing) > MAX_SEGMENTS:
        raise ValueError(f"packets need {len(lacing)} lacing values; one page holds {MAX_SEGMENTS}")
    header = _HEADER.pack(CAPTURE_PATTERN, 0, flags, granule, serial, sequence, 0, len(lacing))
    page = bytearray(header + lacing + b"".join(packets))
    struct.pack_into("<I", page, _CRC_OFFSET, ogg_crc32(bytes(page)))
    return bytes(page)


class OggPageReader:
    """Incremental page parser: bytes in any chunking -> complete, CRC-checked pages.

    Malformed input raises ``InvalidOggError``; after that the reader refuses further
    input (the stream position is lost). At most ``max_page_bytes`` stay buffered.
    """

    def __init__(self, max_page_bytes: int = MAX_PAGE_BYTES) -> None:
        if not HEADER_BYTES + MAX_SEGMENTS <= max_page_bytes <= MAX_PAGE_BYTES:
            raise ValueError(f"max_page_bytes must be in [{HEADER_BYTES + MAX_SEGMENTS}, {MAX_PAGE_BYTES}]")
        self.max_page_bytes = max_page_bytes
        self._buffer = bytearray()
        self._failed: InvalidOggError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[OggPage]:
        if self._failed is not None:
            raise InvalidOggError(f"stream already rejected: {self._failed}")
        self._buffer += data
        pages: list[OggPage] = []
        offset = 0
        try:
            while (page_and_size := self._parse_one(offset)) is not None:
                page, size = page_and_size
                pages.append(page)
                offset += size
        except InvalidOggError as exc:
            self._failed = exc
            self._buffer.clear()
            raise
        del self._buffer[:offset]
        return pages

    def _parse_one(self, offset: int) -> tuple[OggPage, int] | None:
        """Parse the page at ``offset``, or return None if it is not complete yet."""
        buffer = self._buffer
        available = len(buffer) - offset
        # Check the capture pattern as soon as its bytes arrive, so garbage fails fast.
        head = bytes(buffer[offset : offset + 4])
        if head != CAPTURE_PATTERN[: len(head)]:
            raise InvalidOggError("missing Ogg capture pattern 'OggS'")
        if available < HEADER_BYTES:
            return None
        _capture, version, flags, granule, serial, sequence, crc, n_segments = _HEADER.unpack_from(buffer, offset)
        if version != 0:
            raise InvalidOggError(f"unsupported Ogg version {version}")
        if flags & ~_KNOWN_FLAGS:
            raise InvalidOggError(f"reserved Ogg header flags set: {flags:#04x}")
        if available < HEADER_BYTES + n_segments:
            return None
        lacing = bytes(buffer[offset + HEADER_BYTES : offset + HEADER_BYTES + n_segments])
        size = HEADER_BYTES + n_segments + sum(lacing)
        if size > self.max_page_bytes:
            raise InvalidOggError(f"Ogg page of {size} bytes exceeds the {self.max_page_bytes}-byte limit")
        if available < size:
            return None
        raw = bytearray(buffer[offset : offset + size])
        raw[_CRC_OFFSET : _CRC_OFFSET + 4] = b"\x00\x00\x00\x00"
        if ogg_crc32(bytes(raw)) != crc:
            raise InvalidOggError("Ogg page CRC mismatch")
        body = bytes(raw[HEADER_BYTES + n_segments :])
        return OggPage(flags, granule, serial, sequence, lacing, body), size
