"""Incremental Ogg-Opus stream writer and reader (RFC 7845 over RFC 3533 pages).

The Ogg framing is hand-written (see ``ogg.py`` for why); Opus packets go through PyAV's
libopus (``opus.py``). Both sides work on live streams:

* ``OggOpusWriter``: PCM chunks in -> bytes of complete pages out, one page per Opus packet
  so nothing waits on a page filling up. The first call also emits the OpusHead and
  OpusTags header pages. This is what Moshi/PersonaPlex browser clients expect in each
  binary WebSocket message. ``close()`` ends the stream with an EOS page whose granule
  position trims the padding, so a full round trip returns exactly the input length.
* ``OggOpusReader``: byte chunks in (pages split across calls, or many in one) -> mono
  float32 PCM as soon as each page completes. It validates framing (capture pattern,
  version, CRC, sequence numbers, continuation flags), the header packets, and applies
  pre-skip, output gain and end trimming. Chained streams (a new BOS after EOS) are
  accepted; multiplexed streams are not. Buffering is bounded by ``max_page_bytes`` (one
  page) and ``max_packet_bytes`` (a packet spanning pages); decoded audio per ``feed`` (or ``decode``)
  call by ``max_feed_seconds`` (``AudioLimitError``), and per second of wall time by an
  optional ``DecodeRateLimit`` charged packet by packet, so decoding stops within a page.
  Any error is a ``CodecError`` and ends the stream: later calls raise it again.

Granule positions and pre-skip count 48 kHz samples whatever the PCM rate (RFC 7845 §4).
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass
from enum import Enum

import numpy as np

from rtserve.codecs.decode_rate import DecodeRateLimit
from rtserve.codecs.errors import AudioLimitError, CodecError, InvalidOggError, UnsupportedFormatError
from rtserve.codecs.ogg import FLAG_BOS, FLAG_EOS, MAX_PAGE_BYTES, OggPage, OggPageReader, build_page
from rtserve.codecs.opus import OPUS_GRANULE_RATE, OpusApplication, OpusDecoder, OpusEncoder, check_opus_rate
from rtserve.codecs.pcm import FloatArray, as_mono_float32

OPUS_HEAD_MAGIC = b"OpusHead"
OPUS_TAGS_MAGIC = b"OpusTags"
_OPUS_HEAD = struct.Struct("<8sBBHIhB")  # magic, version, channels, pre-skip, input rate, gain, mapping
_EMPTY = np.zeros(0, dtype=np.float32)


@dataclass(frozen=True, slots=True)
class OpusHead:
    channels: int
    pre_skip: int  # 48 kHz samples to drop at the start
    input_sample_rate: int  # informational only
    output_gain_q8: int = 0  # dB in Q7.8

    def to_bytes(self) -> bytes:
        return _OPUS_HEAD.pack(
            OPUS_HEAD_MAGIC, 1, self.channels, self.pre_skip, self.input_sample_rate, self.output_gain_q8, 0
        )

    @classmethod
    def parse(cls, packet: bytes) -> OpusHead:
        if not packet.startswith(OPUS_HEAD_MAGIC):
            raise InvalidOggError("first packet is not an OpusHead")
        if len(packet) < _OPUS_HEAD.size:
            raise InvalidOggError("OpusHead packet is truncated")
        _, version, channels, pre_skip, input_rate, gain, mapping = _OPUS_HEAD.unpack_from(packet)
        if version >> 4:
            raise UnsupportedFormatError(f"unsupported Ogg-Opus major version in version byte {version}")
        if mapping != 0:
            raise UnsupportedFormatError(f"unsupported Opus channel mapping family {mapping} (only 0: mono/stereo)")
        if channels not in (1, 2):
            raise InvalidOggError(f"OpusHead channel count {channels} is invalid for mapping family 0")
        return cls(channels, pre_skip, input_rate, gain)


def opus_tags_packet(vendor: str) -> bytes:
    encoded = vendor.encode("utf-8")
    return OPUS_TAGS_MAGIC + struct.pack("<I", len(encoded)) + encoded + struct.pack("<I", 0)


def check_opus_tags(packet: bytes) -> None:
    """Validate the OpusTags structure (vendor string + length-prefixed comments)."""
    if not packet.startswith(OPUS_TAGS_MAGIC):
        raise InvalidOggError("second packet is not OpusTags")
    offset = len(OPUS_TAGS_MAGIC)
    try:
        (vendor_length,) = struct.unpack_from("<I", packet, offset)
        offset += 4 + vendor_length
        (count,) = struct.unpack_from("<I", packet, offset)
        offset += 4
        # Each comment needs at least its 4-byte length, so the loop is bounded by the packet.
        if count > (len(packet) - offset) // 4:
            raise InvalidOggError("OpusTags comment count exceeds the packet")
        for _ in range(count):
            (length,) = struct.unpack_from("<I", packet, offset)
            offset += 4 + length
    except struct.error as exc:
        raise InvalidOggError("OpusTags packet is truncated") from exc
    if offset > len(packet):
        raise InvalidOggError("OpusTags packet is truncated")


class OggOpusWriter:
    """Mono float32 PCM -> Ogg-Opus bytes, page by page. One instance per stream."""

    def __init__(
        self,
        sample_rate: int = 24000,
        frame_ms: int = 20,
        bitrate: int = 32000,
        application: OpusApplication = "audio",
        complexity: int = 10,
        serial: int | None = None,
        vendor: str = "rtserve",
    ) -> None:
        self._encoder = OpusEncoder(sample_rate, frame_ms, bitrate, application, complexity)
        self.sample_rate = sample_rate
        self.serial = secrets.randbits(32) if serial is None else serial
        self._vendor = vendor
        self._sequence = 0
        self._granule = 0  # 48 kHz samples in the packets written so far (pre-skip included)
        self._samples_in = 0
        self._headers_sent = False
        self._closed = False

    def write(self, samples: FloatArray) -> bytes:
        """Encode ``samples``; return the pages completed now (headers on the first call)."""
        if self._closed:
            raise RuntimeError("OggOpusWriter.write() after close()")
        samples = as_mono_float32(samples)
        out = self._headers()
        self._samples_in += len(samples)
        for packet in self._encoder.encode(samples):
            out += self._audio_page(packet, flags=0)
        return bytes(out)

    def close(self) -> bytes:
        """Encode what is buffered and end the stream with an EOS page."""
        if self._closed:
            return b""
        self._closed = True
        out = self._headers()
        # finish() always yields a packet: libopus lookahead is never zero.
        *packets, last = self._encoder.finish()
        for packet in packets:
            out += self._audio_page(packet, flags=0)
        end = self._encoder.pre_skip_48k + self._samples_in * OPUS_GRANULE_RATE // self.sample_rate
        out += self._audio_page(last, flags=FLAG_EOS, end_granule=end)
        return bytes(out)

    def _headers(self) -> bytearray:
        if self._headers_sent:
            return bytearray()
        self._headers_sent = True
        head = OpusHead(channels=1, pre_skip=self._encoder.pre_skip_48k, input_sample_rate=self.sample_rate)
        return self._page(head.to_bytes(), flags=FLAG_BOS, granule=0) + self._page(
            opus_tags_packet(self._vendor), flags=0, granule=0
        )

    def _audio_page(self, packet: bytes, *, flags: int, end_granule: int | None = None) -> bytearray:
        self._granule += self._encoder.frame_duration_48k
        granule = self._granule if end_granule is None else min(self._granule, end_granule)
        return self._page(packet, flags=flags, granule=granule)

    def _page(self, packet: bytes, *, flags: int, granule: int) -> bytearray:
        page = build_page(serial=self.serial, sequence=self._sequence, granule=granule, packets=[packet], flags=flags)
        self._sequence += 1
        return bytearray(page)


class _State(Enum):
    EXPECT_HEAD = "expect_head"
    EXPECT_TAGS = "expect_tags"
    AUDIO = "audio"


class OggOpusReader:
    """Ogg-Opus bytes in any chunking -> mono float32 PCM at ``sample_rate``."""

    def __init__(
        self,
        sample_rate: int = 24000,
        max_page_bytes: int = MAX_PAGE_BYTES,
        max_packet_bytes: int = 65536,
        max_feed_seconds: float = 60.0,
        rate_limit: DecodeRateLimit | None = None,
    ) -> None:
        check_opus_rate(sample_rate)
        self.sample_rate = sample_rate
        self.max_packet_bytes = max_packet_bytes
        # Tiny Opus packets decode to ~1000x their size in samples: bound the audio per call.
        self.max_feed_samples = int(max_feed_seconds * sample_rate)
        self._rate_limit = rate_limit
        self._pages = OggPageReader(max_page_bytes)
        self._state = _State.EXPECT_HEAD
        self._failed: CodecError | None = None
        self._serial = 0
        self._next_sequence = 0
        self._partial: bytearray | None = None  # packet continued on the next page
        self._decoder: OpusDecoder | None = None
        self._head: OpusHead | None = None
        self._skip = 0  # output samples of pre-skip still to drop
        self._emitted = 0  # output samples returned for the current logical stream
        self._gain = 1.0

    def feed(self, data: bytes) -> FloatArray:
        """Consume bytes; return the PCM of every page completed by them (maybe empty)."""
        return self.decode(self.read_pages(data))

    def read_pages(self, data: bytes) -> list[OggPage]:
        """The first half of ``feed``: the pages ``data`` completes, framing and CRC checked but
        nothing decoded yet (cheap; ``OggPage.packets_ending`` bounds the decoding work, at most
        120 ms of audio per Opus packet). Pass them to ``decode`` in the order they came."""
        self._raise_if_failed()
        try:
            return self._pages.feed(data)
        except CodecError as exc:
            self._failed = exc
            raise

    def decode(self, pages: list[OggPage]) -> FloatArray:
        """The second half of ``feed``: the PCM of ``pages`` (maybe empty)."""
        self._raise_if_failed()
        try:
            chunks: list[FloatArray] = []
            budget = self.max_feed_samples
            for page in pages:
                pcm = self._on_page(page)
                budget -= len(pcm)
                if budget < 0:
                    raise AudioLimitError(f"one chunk of Ogg-Opus decoded to more than {self.max_feed_samples} samples")
                chunks.append(pcm)
        except CodecError as exc:
            self._failed = exc
            raise
        return np.concatenate(chunks) if chunks else _EMPTY

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise type(self._failed)(f"stream already rejected: {self._failed}")

    def flush(self) -> FloatArray:
        """The stream stopped without EOS: return the decoder's held-back tail."""
        if self._decoder is None or self._failed is not None:
            return _EMPTY
        return self._emit(self._decoder.flush())

    def _on_page(self, page: OggPage) -> FloatArray:
        if self._state is _State.EXPECT_HEAD:
            self._start_stream(page)
            return _EMPTY
        if page.serial != self._serial:
            raise InvalidOggError("multiplexed Ogg streams are not supported")
        if page.bos:
            raise InvalidOggError("BOS page in the middle of a stream")
        if page.sequence != self._next_sequence:
            raise InvalidOggError(f"Ogg page {page.sequence} arrived, expected {self._next_sequence}")
        self._next_sequence = (page.sequence + 1) & 0xFFFFFFFF
        if page.continued != (self._partial is not None):
            raise InvalidOggError("Ogg continuation flag does not match the previous page")
        out: list[FloatArray] = []
        pieces = page.segments()
        for index, (piece, complete) in enumerate(pieces):
            packet = self._assemble(piece, complete)
            if packet is None:
                continue
            if self._state is _State.EXPECT_TAGS:
                check_opus_tags(packet)
                if index != len(pieces) - 1:
                    raise InvalidOggError("audio data shares a page with OpusTags")
                self._state = _State.AUDIO
            else:
                assert self._decoder is not None  # AUDIO state implies a decoder
                decoded = self._decoder.decode(packet)
                if self._rate_limit is not None:
                    self._rate_limit.charge(len(decoded) / self.sample_rate)
                out.append(self._emit(decoded))
        pcm = np.concatenate(out) if out else _EMPTY
        return self._end_stream(page, pcm) if page.eos else pcm

    def _start_stream(self, page: OggPage) -> None:
        if not page.bos:
            raise InvalidOggError("Ogg-Opus stream must start with a BOS page")
        pieces = page.segments()
        if page.continued or len(pieces) != 1 or not pieces[0][1]:
            raise InvalidOggError("the BOS page must hold exactly the OpusHead packet")
        head = OpusHead.parse(pieces[0][0])
        self._head = head
        self._serial = page.serial
        self._next_sequence = (page.sequence + 1) & 0xFFFFFFFF
        self._decoder = OpusDecoder(self.sample_rate, channels=head.channels)
        self._skip = head.pre_skip * self.sample_rate // OPUS_GRANULE_RATE
        self._emitted = 0
        self._gain = 10.0 ** (head.output_gain_q8 / (20.0 * 256.0))
        self._state = _State.EXPECT_TAGS
        if page.eos:
            raise InvalidOggError("Ogg-Opus stream ended on its BOS page")

    def _assemble(self, piece: bytes, complete: bool) -> bytes | None:
        """Join packet pieces across pages; return the packet once it is complete."""
        if self._partial is not None:
            self._partial += piece
            piece = bytes(self._partial)
        if len(piece) > self.max_packet_bytes:
            raise InvalidOggError(f"Ogg packet exceeds the {self.max_packet_bytes}-byte limit")
        if complete:
            self._partial = None
            return piece
        self._partial = bytearray(piece)
        return None

    def _emit(self, pcm: FloatArray) -> FloatArray:
        """Apply pre-skip and output gain to decoded samples."""
        if self._skip:
            dropped = min(self._skip, len(pcm))
            self._skip -= dropped
            pcm = pcm[dropped:]
        if self._gain != 1.0:
            pcm = pcm * np.float32(self._gain)
        self._emitted += len(pcm)
        return pcm

    def _end_stream(self, page: OggPage, pcm: FloatArray) -> FloatArray:
        """EOS: flush the decoder, trim to the final granule, wait for a chained stream."""
        if self._partial is not None:
            raise InvalidOggError("Ogg-Opus stream ended inside a packet")
        if self._state is not _State.AUDIO:
            raise InvalidOggError("Ogg-Opus stream ended before its OpusTags")
        assert self._decoder is not None and self._head is not None
        pcm = np.concatenate((pcm, self._emit(self._decoder.flush())))
        if page.granule >= 0:
            # End trimming: the EOS granule says how many samples the stream really holds.
            total = max(0, page.granule - self._head.pre_skip) * self.sample_rate // OPUS_GRANULE_RATE
            pcm = pcm[: max(0, len(pcm) - max(0, self._emitted - total))]
        self._state = _State.EXPECT_HEAD
        self._decoder = None
        return pcm
