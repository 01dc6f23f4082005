"""Where a session's events leave the core: sequencing, the replay journal, and the one
consumer ("attachment") currently reading the session's output buffer.

A transport attaches, iterates, and detaches on disconnect; a resume attaches a new
consumer, which supersedes the old one (it receives ``session.replaced`` and ends).
While nobody is attached a parked drainer keeps sequencing buffered events into the
journal, so a disconnected client costs replay history, not the session.

Sequencing happens under the buffer's lock (an event invalidated while held is
skipped, never numbered) and with no ``await`` between taking an event and journaling
it, so every sequence number is journaled exactly once and in order.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from rtserve.clock import Clock
from rtserve.sessions.buffer import INTERRUPTED, BufferedEvent, OutputBuffer
from rtserve.sessions.events import SessionEvent, SessionReplaced
from rtserve.sessions.journal import JournalEntry, ReplayJournal
from rtserve.sessions.projections.base import Projection, with_seq


class _AttachmentState(enum.Enum):
    ACTIVE = enum.auto()
    SUPERSEDED = enum.auto()  # a resume took over: ``session.replaced`` is still to be delivered
    ENDED = enum.auto()


@dataclass(slots=True, eq=False)
class Delivery:
    """One event as it goes on the wire: ``text`` includes ``server_event_seq`` when sequenced."""

    event: SessionEvent
    text: str
    seq: int | None


class SessionOutlet:
    def __init__(
        self, session_id: str, buffer: OutputBuffer, journal: ReplayJournal | None, projection: Projection, clock: Clock
    ) -> None:
        self.session_id = session_id
        self.buffer = buffer
        self.journal = journal  # None: the session is not resumable, nothing is kept
        self.projection = projection
        self._clock = clock
        self.next_seq = 1
        self.current: Attachment | None = None
        self._parked: asyncio.Task[None] | None = None
        self._drainers: set[asyncio.Task[None]] = set()  # strong refs until each one returns
        self.on_detach: Callable[[Attachment], bool] | None = None  # set by the manager

    def sequence(self, entry: BufferedEvent) -> Delivery:
        """Number ``entry`` and journal it; called under the buffer lock (``if_valid``)."""
        seq = self.next_seq
        self.next_seq += 1
        event = entry.event
        event.server_event_seq = seq
        text = with_seq(entry.text, seq)
        if self.journal is not None:
            self.journal.append(
                JournalEntry(seq, event, text, entry.nbytes + len(text) - len(entry.text), self._clock.monotonic())
            )
        return Delivery(event, text, seq)

    def attach(
        self,
        generation: int,
        projection: Projection | None = None,
        *,
        preamble: Iterable[SessionEvent] = (),
        replay: Iterable[JournalEntry] = (),
    ) -> Attachment:
        """Make a new consumer current; the previous one (if any) is superseded."""
        old = self.current
        attachment = Attachment(self, generation, projection or self.projection, preamble, replay)
        self.current = attachment
        self.buffer.claim(attachment)  # interrupts the old consumer or the parked drainer
        self._parked = None
        if old is not None:
            old._supersede(generation)
        return attachment

    def detach(self, attachment: Attachment) -> bool:
        """End ``attachment`` if it is current and park the stream; False otherwise."""
        if self.current is not attachment:
            return False
        self.current = None
        attachment._end()
        self.park()
        return True

    def park(self) -> None:
        """Keep draining into the journal while nobody is attached."""
        if self.buffer.finished or self._parked is not None:
            return
        owner = object()
        self.buffer.claim(owner)
        self._parked = asyncio.get_running_loop().create_task(self._drain_parked(owner))
        self._drainers.add(self._parked)
        self._parked.add_done_callback(self._drainers.discard)

    async def _drain_parked(self, owner: object) -> None:
        while True:
            entry = await self.buffer.next_entry(owner)
            if entry is None or entry is INTERRUPTED:
                return
            assert isinstance(entry, BufferedEvent)
            self.buffer.if_valid(entry, self.sequence)

    async def stop(self) -> None:
        """Stop any parked drainer and wait for it to leave."""
        self._parked = None
        tasks = list(self._drainers)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Attachment:
    """One consumer of a session's events. Iterate it for typed events, or use
    ``deliveries()`` for the wire text. Ends after the terminal event, on detach, or
    after ``session.replaced`` when a resume took over."""

    def __init__(
        self,
        outlet: SessionOutlet,
        generation: int,
        projection: Projection,
        preamble: Iterable[SessionEvent],
        replay: Iterable[JournalEntry],
    ) -> None:
        self._outlet = outlet
        self.session_id = outlet.session_id
        self.generation = generation
        self.projection = projection
        self._preamble: deque[SessionEvent] = deque(preamble)
        self._replay: deque[JournalEntry] = deque(replay)
        self._state = _AttachmentState.ACTIVE
        self._replaced_by = 0

    @property
    def active(self) -> bool:
        return self._state is _AttachmentState.ACTIVE

    def detach(self) -> bool:
        """The transport lost its peer: start the disconnect grace. False when refused
        (a newer attachment owns the session, or the session is gone)."""
        if self._state is not _AttachmentState.ACTIVE or self._outlet.on_detach is None:
            return False
        return self._outlet.on_detach(self)

    async def next_delivery(self) -> Delivery | None:
        """The next event for this consumer; None at the end of its stream."""
        while True:
            if self._preamble:
                event = self._preamble.popleft()
                return Delivery(event, self.projection.render_text(event), None)
            if self._replay:
                entry = self._replay.popleft()
                return Delivery(entry.event, self._text(entry.event, entry.text, entry.seq), entry.seq)
            if self._state is _AttachmentState.SUPERSEDED:
                self._state = _AttachmentState.ENDED
                event = SessionReplaced(session_id=self.session_id, attachment_generation=self._replaced_by)
                return Delivery(event, self.projection.render_text(event), None)
            if self._state is _AttachmentState.ENDED:
                return None
            got = await self._outlet.buffer.next_entry(self)
            if got is INTERRUPTED:
                continue  # superseded or detached meanwhile: the state says which
            if got is None:
                self._state = _AttachmentState.ENDED
                return None
            assert isinstance(got, BufferedEvent)
            delivery = self._outlet.buffer.if_valid(got, self._outlet.sequence)
            if delivery is None:
                continue  # invalidated while held (cancel, barge-in): never numbered
            if self.projection is not self._outlet.projection:
                delivery.text = self._text(delivery.event, delivery.text, delivery.seq)
            return delivery

    async def deliveries(self) -> AsyncIterator[Delivery]:
        while (delivery := await self.next_delivery()) is not None:
            yield delivery

    def __aiter__(self) -> AsyncIterator[SessionEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SessionEvent]:
        while (delivery := await self.next_delivery()) is not None:
            yield delivery.event

    def _text(self, event: SessionEvent, session_text: str, seq: int | None) -> str:
        if self.projection is self._outlet.projection:
            return session_text
        text = self.projection.render_text(event)
        return text if seq is None else with_seq(text, seq)

    def _supersede(self, generation: int) -> None:
        if self._state is _AttachmentState.ACTIVE:
            self._state = _AttachmentState.SUPERSEDED
            self._replaced_by = generation

    def _end(self) -> None:
        self._state = _AttachmentState.ENDED
