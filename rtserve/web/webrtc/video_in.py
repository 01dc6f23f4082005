"""The caller's camera into the session (docs/video.md#webrtc-video): VP8 or H.264, decoded by aiortc.

One task per call reads the video track from the moment it appears (a track nobody reads
grows without bound, ``track_backlog``); at most ``BACKLOG_FRAMES`` decoded frames wait, the
oldest dropped. ``VideoInput`` keeps one frame per sampling period, scaled by
libswscale and stored as a bounded JPEG on a codec thread; the rest cost only their decode,
which aiortc has done already.
"""

from __future__ import annotations

import logging

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from rtserve.codecs.images import frame_data_url
from rtserve.web.video_input import VideoInput
from rtserve.web.webrtc.track_backlog import shed_backlog

log = logging.getLogger(__name__)

BACKLOG_FRAMES = 2  # decoded frames waiting: a reader behind by more only needs the newest


class InboundVideo:
    def __init__(self, track: MediaStreamTrack, frames: VideoInput) -> None:
        self._track = track
        self._frames = frames

    async def run(self) -> None:
        while True:
            try:
                frame = await self._track.recv()
            except MediaStreamError:  # the track ended (peer gone, call closed)
                return
            shed_backlog(self._track, BACKLOG_FRAMES)  # frames behind the newest are worth nothing here
            if isinstance(frame, av.VideoFrame) and self._frames.due():
                await self._frames.keep(frame_data_url, frame)
