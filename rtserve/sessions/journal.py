"""The replay journal of one session: delivered (sequenced) events kept for a resume.

Bounded by bytes and by age (``resume_replay_max_bytes_per_session``,
``resume_replay_ttl_s``) and trimmed by client acknowledgements (``EventAck``). A resume
asks for everything after the last sequence number the client received; when part of
that range is gone the answer is a gap reason instead: ``journal_overflow`` if the byte
bound evicted it, ``journal_gap`` otherwise (aged out, or a sequence the server never sent).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rtserve.clock import Clock
from rtserve.sessions.events import ResyncReason, SessionEvent


@dataclass(slots=True, eq=False)
class JournalEntry:
    seq: int
    event: SessionEvent
    text: str  # wire text including server_event_seq
    nbytes: int
    at: float


class ReplayJournal:
    def __init__(self, clock: Clock, *, max_bytes: int, ttl_s: float) -> None:
        self._clock = clock
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._entries: deque[JournalEntry] = deque()
        self._bytes = 0
        self.last_seq = 0  # highest sequence number ever journaled
        self._acked_through = 0
        self._overflow_through = 0  # highest seq evicted by the byte bound

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, entry: JournalEntry) -> None:
        self.last_seq = entry.seq
        self._entries.append(entry)
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes and self._entries:
            evicted = self._entries.popleft()
            self._bytes -= evicted.nbytes
            self._overflow_through = evicted.seq
        self._expire()

    def ack(self, seq: int) -> None:
        """The client holds everything through ``seq``: those entries are no longer needed."""
        seq = min(seq, self.last_seq)
        self._acked_through = max(self._acked_through, seq)
        while self._entries and self._entries[0].seq <= seq:
            self._bytes -= self._entries.popleft().nbytes

    def replay_after(self, last_seq: int | None) -> list[JournalEntry] | ResyncReason:
        """Entries after ``last_seq`` (None: the client received nothing), or a gap reason."""
        self._expire()
        start = 0 if last_seq is None else last_seq
        if start > self.last_seq or start < 0:
            return "journal_gap"
        if start == self.last_seq:
            return []
        first_kept = self._entries[0].seq if self._entries else self.last_seq + 1
        if start + 1 < first_kept:
            return "journal_overflow" if self._overflow_through > start else "journal_gap"
        return [e for e in self._entries if e.seq > start]

    def _expire(self) -> None:
        horizon = self._clock.monotonic() - self.ttl_s
        while self._entries and self._entries[0].at < horizon:
            self._bytes -= self._entries.popleft().nbytes
