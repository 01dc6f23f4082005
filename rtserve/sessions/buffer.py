"""The bounded per-session output buffer (docs/sessions.md#output-buffer).

Accounting is on the wire: each event is rendered once, at ``put``, by the session's
projection, and ``pending_bytes`` is the UTF-8 length of that compact JSON (base64
audio included). The rendered text is kept and reused for delivery, so what was counted
is exactly what is sent, and a queued event can never change size afterwards.

Three lanes:

* ordinary events must fit ``max_bytes`` / ``max_events``;
* errors and response endings may use the main budget plus a reserve
  (``reserve_bytes`` / ``reserve_events``), keeping FIFO order with everything else;
* one closure event (``SessionClosed`` / ``SessionExpired``) has its own slot, so a
  full buffer can never prevent a session from ending.

The one event most recently handed to the consumer ("held") is outside the budget; it
can still be invalidated, and consumers re-check it with ``if_valid()`` before delivery.
Queue updates are under a ``threading.Lock`` and a waiting ``get`` is woken thread-safely,
so producers may live on another thread (an engine thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from rtserve.config import SessionLimits
from rtserve.sessions.errors import OutputOverflowError
from rtserve.sessions.events import CLOSURE, ORDINARY, AudioDelta, SessionEvent, TerminalEvent
from rtserve.sessions.projections.base import utf8_len

OVERSIZED_CLOSE_REASON = "close_details_exceed_output_limit"
T = TypeVar("T")


@dataclass(slots=True, eq=False)
class BufferedEvent:
    """An event with the exact wire text it was counted by."""

    event: SessionEvent
    text: str
    nbytes: int
    valid: bool = True


class _Interrupted:
    """``next_entry`` result for a consumer that no longer owns the buffer."""


INTERRUPTED = _Interrupted()


class OutputBuffer:
    def __init__(
        self,
        render: Callable[[SessionEvent], str],
        *,
        max_bytes: int,
        max_events: int,
        reserve_bytes: int = 64 * 1024,
        reserve_events: int = 8,
        close_details_max_bytes: int = 4 * 1024,
    ) -> None:
        self._render = render
        self.max_bytes = max_bytes
        self.max_events = max_events
        self.reserve_bytes = reserve_bytes
        self.reserve_events = reserve_events
        self.close_details_max_bytes = close_details_max_bytes
        self._lock = threading.Lock()
        self._queue: deque[BufferedEvent] = deque()
        self._pending_bytes = 0
        self._closing = False  # close() called: no more puts
        self._closure: BufferedEvent | None = None
        self._closure_taken = False
        self._ended = False  # None was returned: the stream is over for good
        self._held: BufferedEvent | None = None
        self._owner: object | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_loop: asyncio.AbstractEventLoop | None = None
        self._waiter_thread = 0

    @classmethod
    def from_limits(cls, limits: SessionLimits, render: Callable[[SessionEvent], str]) -> OutputBuffer:
        return cls(
            render,
            max_bytes=limits.max_pending_output_bytes_per_session,
            max_events=limits.max_pending_output_events_per_session,
            reserve_bytes=limits.output_reserve_bytes,
            reserve_events=limits.output_reserve_events,
            close_details_max_bytes=limits.close_details_max_bytes,
        )

    # -- observation ------------------------------------------------------

    @property
    def pending_events(self) -> int:
        return len(self._queue)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def closed(self) -> bool:
        """No further event will be accepted (the closure slot is set or the stream closed)."""
        return self._closing

    @property
    def finished(self) -> bool:
        """The consumer has seen the end of the stream."""
        return self._ended

    # -- producers --------------------------------------------------------

    def put(self, event: SessionEvent) -> bool:
        """Queue ``event``; False (ignored) once closed. Raises ``OutputOverflowError``,
        leaving every counter unchanged, when it does not fit its lane's budget."""
        if event.lane == CLOSURE:
            raise TypeError("closure events go through close()")
        text = self._render(event)  # outside the lock: rendering may encode audio
        nbytes = utf8_len(text)
        with self._lock:
            if self._closing:
                return False
            max_bytes, max_events = self.max_bytes, self.max_events
            if event.lane != ORDINARY:
                max_bytes += self.reserve_bytes
                max_events += self.reserve_events
            if self._pending_bytes + nbytes > max_bytes or len(self._queue) + 1 > max_events:
                raise OutputOverflowError(
                    f"{type(event).__name__} of {nbytes} B does not fit: {len(self._queue)} events / "
                    f"{self._pending_bytes} B pending of {max_events} / {max_bytes}"
                )
            self._queue.append(BufferedEvent(event, text, nbytes))
            self._pending_bytes += nbytes
            self._wake_locked()
        return True

    def close(self, closure: TerminalEvent | None = None) -> bool:
        """Set the closure once; later calls are ignored. The stream yields everything
        queued, then the closure (if any), then ``None`` forever. A closure whose JSON
        exceeds ``close_details_max_bytes`` is replaced by a compact one with the same
        identity and reason ``close_details_exceed_output_limit``."""
        entry = None
        if closure is not None:
            if closure.lane != CLOSURE:
                raise TypeError("close() takes a SessionClosed or SessionExpired")
            text = self._render(closure)
            if utf8_len(text) > self.close_details_max_bytes:
                closure = dataclasses.replace(closure, reason=OVERSIZED_CLOSE_REASON, details={})
                text = self._render(closure)
            entry = BufferedEvent(closure, text, utf8_len(text))
        with self._lock:
            if self._closing:
                return False
            self._closing = True
            self._closure = entry
            self._wake_locked()
        return True

    def invalidate(self, response_id: str, through_epoch: int) -> int:
        """Drop queued audio of ``response_id`` stamped with an epoch <= ``through_epoch``
        and invalidate such audio if the consumer holds it. Returns how many were dropped."""
        with self._lock:
            kept: deque[BufferedEvent] = deque()
            dropped = 0
            for entry in self._queue:
                if _matches(entry.event, response_id, through_epoch):
                    self._pending_bytes -= entry.nbytes
                    dropped += 1
                else:
                    kept.append(entry)
            if dropped:
                self._queue = kept
            held = self._held
            if held is not None and _matches(held.event, response_id, through_epoch):
                held.valid = False
            return dropped

    def holds_audio(self, response_id: str) -> bool:
        """Whether audio of ``response_id`` is still queued (not yet taken by the consumer)."""
        with self._lock:
            return any(isinstance(e.event, AudioDelta) and e.event.response_id == response_id for e in self._queue)

    # -- consumer ---------------------------------------------------------

    def is_valid(self, event: SessionEvent) -> bool:
        with self._lock:
            return self._valid_locked(event)

    @contextmanager
    def guard(self, event: SessionEvent) -> Iterator[bool]:
        """Hold the buffer lock and yield whether ``event`` may still be delivered, so a
        concurrent ``invalidate`` cannot slip between the check and the sequencing."""
        with self._lock:
            yield self._valid_locked(event)

    def if_valid(self, entry: BufferedEvent, deliver: Callable[[BufferedEvent], T]) -> T | None:
        """``deliver(entry)`` under the lock if the entry is still valid, else None: the
        hot-path form of ``guard`` (validity check and sequencing are one atomic step)."""
        with self._lock:
            return deliver(entry) if self._valid_locked(entry.event) else None

    def claim(self, owner: object | None) -> None:
        """Make ``owner`` the only consumer; a waiting ``next_entry`` of anyone else
        returns ``INTERRUPTED``. ``None`` lets any caller consume (plain ``get``)."""
        with self._lock:
            self._owner = owner
            self._wake_locked()

    async def get(self) -> SessionEvent | None:
        """The next event in FIFO order; after the closure, ``None`` forever."""
        while True:
            entry = await self.next_entry()
            if entry is None or isinstance(entry, BufferedEvent):
                return None if entry is None else entry.event

    async def next_entry(self, owner: object | None = None) -> BufferedEvent | _Interrupted | None:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._owner is not None and owner is not self._owner:
                    return INTERRUPTED
                if self._queue:
                    entry = self._queue.popleft()
                    self._pending_bytes -= entry.nbytes
                    self._held = entry
                    return entry
                if self._closing:
                    if self._closure is not None and not self._closure_taken:
                        self._closure_taken = True
                        self._held = self._closure
                        return self._closure
                    self._held = None
                    self._ended = True
                    return None
                waiter = loop.create_future()
                self._waiter, self._waiter_loop = waiter, loop
                self._waiter_thread = threading.get_ident()
            try:
                await waiter
            finally:
                with self._lock:
                    if self._waiter is waiter:
                        self._waiter = None

    # -- internals --------------------------------------------------------

    def _valid_locked(self, event: SessionEvent) -> bool:
        held = self._held
        return not (held is not None and held.event is event and not held.valid)

    def _wake_locked(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if threading.get_ident() == self._waiter_thread:
            waiter.set_result(None)
        else:
            assert self._waiter_loop is not None
            self._waiter_loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _matches(event: SessionEvent, response_id: str, through_epoch: int) -> bool:
    return isinstance(event, AudioDelta) and event.response_id == response_id and event.epoch <= through_epoch
