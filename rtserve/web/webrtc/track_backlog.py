"""The decoded frames a remote track holds that nobody has read yet, bounded by the reader.

aiortc decodes each RTP packet on its own thread and appends the frame to the remote track's
``_queue``, an unbounded asyncio.Queue with no public way to bound or inspect it (aiortc 1.16).
A reader that falls behind (a starved event loop) sheds the oldest frames beyond its bound:
old microphone audio or camera frames are worth less than keeping the call in real time.
"""

from __future__ import annotations

import asyncio

from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcrtpreceiver import RemoteStreamTrack


def shed_backlog(track: MediaStreamTrack, keep_frames: int) -> int:
    """Drop the oldest frames beyond ``keep_frames`` waiting on ``track``; how many went."""
    if not isinstance(track, RemoteStreamTrack):
        return 0
    queue: asyncio.Queue[object] = track._queue
    dropped = 0
    for _ in range(max(0, queue.qsize() - keep_frames)):
        item = queue.get_nowait()
        if item is None:  # the end-of-track marker: keep it for the next recv()
            queue.put_nowait(None)
            break
        dropped += 1
    return dropped
