"""Camera frames from a transport into one session (docs/video.md#frames-in-the-conversation).

Shared by the WebRTC call (decoded ``av.VideoFrame``s) and ``WS /v1/video/chat/stream``
(JPEG/PNG bytes): a frame is kept at most every ``1 / video_input.sample_fps`` seconds, made
a bounded JPEG on the app's codec threads (one at a time per session: a frame that arrives
while the previous one is still being encoded is one more not kept) and handed to the session
as a ``VideoFrame`` command, which holds it for the next user turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from rtserve.config import VideoInputConfig
from rtserve.sessions import SessionHandle
from rtserve.sessions import commands as cmd
from rtserve.web.codec_executor import CodecExecutor

Frame = TypeVar("Frame")


class VideoInput:
    def __init__(
        self,
        handle: SessionHandle,
        codecs: CodecExecutor,
        limits: VideoInputConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handle = handle
        self._codecs = codecs
        self.limits = limits
        self._clock = clock
        self._period = 1.0 / limits.sample_fps
        self._next_at = 0.0
        self._busy = False

    def due(self) -> bool:
        """Whether the frame at hand should be kept; the caller then ``keep``s it."""
        now = self._clock()
        if self._busy or now < self._next_at:
            return False
        self._next_at = now + self._period
        return True

    async def keep(self, encode: Callable[[Frame, VideoInputConfig], str], frame: Frame) -> None:
        """``encode(frame, limits)`` (a ``codecs.images`` function) on a codec thread, into the session.
        Its ``ImageError`` reaches the caller."""
        self._busy = True
        try:
            image = await self._codecs.run(encode, frame, self.limits)
        finally:
            self._busy = False
        self._handle.submit(cmd.VideoFrame(image=image))
