"""``DecodeRateLimit`` on ``OggOpusReader``: decoded audio per second of wall time, per stream."""

from __future__ import annotations

import pytest

from rtserve.codecs.decode_rate import DecodeRateError, DecodeRateLimit
from rtserve.codecs.errors import CodecError
from rtserve.codecs.oggopus import OggOpusReader
from tests.clocks import FakeClock
from tests.codecs.oggpages import amplifying_stream


def test_small_pages_of_long_audio_are_stopped_by_the_rate_not_the_per_feed_bound() -> None:
    clock = FakeClock()
    reader = OggOpusReader(
        24000, max_feed_seconds=60.0, rate_limit=DecodeRateLimit(ratio=2.0, burst_s=10.0, clock=clock.monotonic)
    )
    head, tags, *pages = amplifying_stream(pages=20, packets_per_page=20)  # 2.4 s a page, each under 60 s
    reader.feed(head + tags)
    for page in pages[:4]:  # 9.6 s: within the burst
        assert len(reader.feed(page)) == pytest.approx(24000 * 2.4, rel=0.02)
    with pytest.raises(DecodeRateError) as raised:
        reader.feed(pages[4])
    assert raised.value.code == "decode_rate_exceeded"
    with pytest.raises(CodecError):
        reader.feed(pages[5])  # the stream stays rejected


def test_a_stream_within_the_rate_is_never_stopped() -> None:
    clock = FakeClock()
    reader = OggOpusReader(24000, rate_limit=DecodeRateLimit(ratio=2.0, burst_s=1.5, clock=clock.monotonic))
    head, tags, *pages = amplifying_stream(pages=50, packets_per_page=10)  # 1.2 s a page
    reader.feed(head + tags)
    for page in pages:
        clock.advance(0.6)  # 1.2 s of audio per 0.6 s: exactly the allowed ratio
        assert len(reader.feed(page)) == pytest.approx(24000 * 1.2, rel=0.02)
