"""A runner's single inbox: client commands, engine events and internal items, in order.

Two producers are bounded by ``capacity``: client commands are refused when it is full
(``offer`` returns False: the caller answers with a typed error) and the engine pump
waits for room (``put``). Control items (close, expiry, timers) bypass the bound, so a
flooded session can still be closed; there are at most a handful per session.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Mailbox:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[Any] = deque()
        self._bounded = 0  # items that count against capacity
        self._getter: asyncio.Future[None] | None = None
        self._space: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: Any) -> bool:
        if self._bounded >= self.capacity:
            return False
        self._push(item, bounded=True)
        return True

    async def put(self, item: Any) -> None:
        while self._bounded >= self.capacity:
            self._space = asyncio.get_running_loop().create_future()
            try:
                await self._space
            finally:
                self._space = None
        self._push(item, bounded=True)

    def post(self, item: Any) -> None:
        self._push(item, bounded=False)

    async def get(self) -> Any:
        while not self._items:
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        bounded, item = self._items.popleft()
        if bounded:
            self._bounded -= 1
            if self._space is not None and not self._space.done():
                self._space.set_result(None)
        return item

    def drain(self) -> list[Any]:
        """Remove and return everything queued (used at teardown)."""
        items = [item for _, item in self._items]
        self._items.clear()
        self._bounded = 0
        if self._space is not None and not self._space.done():
            self._space.set_result(None)
        return items

    def _push(self, item: Any, *, bounded: bool) -> None:
        self._items.append((bounded, item))
        if bounded:
            self._bounded += 1
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)
