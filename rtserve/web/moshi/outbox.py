"""Per-connection hand-off from the engine pump to the socket writer.

The engine must never wait for a client, so this queue never blocks its producer:
beyond ``capacity`` the oldest frame's audio is dropped (counted). Its text is kept,
merged into the next frame, because a text piece is tiny and losing one garbles the
transcript.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class AgentFrame:
    pcm: np.ndarray  # float32 mono at the wire rate (24 kHz)
    text: str | None
    produced_at: float  # loop.time() when the engine's frame reached the event loop


class Outbox:
    def __init__(self, capacity: int) -> None:
        self._frames: deque[AgentFrame] = deque()
        self._capacity = capacity
        self._ready = asyncio.Event()
        self._closed = False
        self.dropped = 0

    def put(self, frame: AgentFrame) -> bool:
        """Queue a frame; False when the oldest had to be dropped to make room."""
        self._frames.append(frame)
        self._ready.set()
        if len(self._frames) <= self._capacity:
            return True
        oldest = self._frames.popleft()
        if oldest.text:
            following = self._frames[0]
            following.text = oldest.text + (following.text or "")
        self.dropped += 1
        return False

    def close(self) -> None:
        """No more frames: ``get`` returns what is queued, then ``None``."""
        self._closed = True
        self._ready.set()

    def __len__(self) -> int:
        return len(self._frames)

    async def get(self) -> AgentFrame | None:
        while not self._frames:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._frames.popleft()
