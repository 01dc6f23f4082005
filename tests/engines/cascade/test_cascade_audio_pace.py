"""``AudioPace``: a reply's audio runs at most ``max_ahead_s`` ahead of real time from its first
chunk, so a listener at real time (a WebRTC track) never has more than that waiting for it."""

from __future__ import annotations

import asyncio

from rtserve.engines.audio_pace import AudioPace

RATE = 1000
CHUNK = 100  # 0.1 s


async def test_a_reply_made_at_once_is_held_to_the_bound_ahead_of_real_time() -> None:
    loop = asyncio.get_running_loop()
    pace = AudioPace(0.2, RATE)
    started = loop.time()
    handed: list[float] = []
    for _ in range(8):  # 0.8 s of audio, made as fast as it is asked for
        await pace.hold(CHUNK)
        handed.append(loop.time() - started)
    assert handed[2] < 0.1  # the first 0.2 s ahead go at once
    # Chunk k goes once the audio before it (k x 0.1 s) is no more than 0.2 s ahead.
    for k in (4, 7):
        assert handed[k] >= k * 0.1 - 0.2 - 0.02, handed
    assert handed[-1] < 2.0  # not slower than real time (a loaded machine's margin)


async def test_a_reply_slower_than_real_time_never_waits() -> None:
    loop = asyncio.get_running_loop()
    pace = AudioPace(0.05, RATE)
    waited = 0.0
    for _ in range(4):
        await asyncio.sleep(0.12)  # each 0.1 s chunk takes longer than it plays
        before = loop.time()
        await pace.hold(CHUNK)
        waited += loop.time() - before
    assert waited < 0.02
