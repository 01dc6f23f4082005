"""The camera frames a session holds until the user's next turn (docs/video.md#frames-in-the-conversation).

Transports sample and downscale frames before they get here (``web/video_input.py``); the
session keeps the newest ``sessions.max_video_frames`` (drop-oldest) and hands them all to the
next user turn, a committed audio turn or a user message, as that turn's images.
"""

from __future__ import annotations

from collections import deque


class FrameWindow:
    def __init__(self, max_frames: int) -> None:
        self._frames: deque[str] = deque(maxlen=max_frames)

    def add(self, image: str) -> None:
        self._frames.append(image)

    def take(self) -> tuple[str, ...]:
        """Every frame held, oldest first; the window is empty afterwards."""
        frames = tuple(self._frames)
        self._frames.clear()
        return frames

    def __len__(self) -> int:
        return len(self._frames)
