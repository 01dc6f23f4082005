"""Stateful property test of the output buffer against a plain model of docs/sessions.md#output-buffer.

Invariants checked after every step: never over budget (ordinary events within the
main budget, reserve-eligible within main + reserve), counters equal the model, FIFO
order for everything delivered, invalidated audio never delivered, exactly one closure
then ``None`` forever.
"""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rtserve.sessions.buffer import OutputBuffer
from rtserve.sessions.errors import OutputOverflowError
from rtserve.sessions.events import (
    ORDINARY,
    AudioDelta,
    ErrorEvent,
    ResponseDone,
    SessionClosed,
    SessionEvent,
    TranscriptDelta,
)
from rtserve.sessions.projections import RealtimeProjection
from rtserve.sessions.projections.base import utf8_len

PROJECTION = RealtimeProjection("beta")
RESPONSES = st.sampled_from(["r1", "r2", "r3"])
EPOCHS = st.integers(0, 2)


class BufferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()

    def teardown(self) -> None:
        self.loop.close()

    @initialize(
        max_events=st.integers(1, 6),
        max_bytes=st.integers(150, 2000),
        reserve_events=st.integers(0, 3),
        reserve_bytes=st.integers(0, 1500),
    )
    def create(self, max_events: int, max_bytes: int, reserve_events: int, reserve_bytes: int) -> None:
        self.buffer = OutputBuffer(
            PROJECTION.render_text,
            max_bytes=max_bytes,
            max_events=max_events,
            reserve_bytes=reserve_bytes,
            reserve_events=reserve_events,
        )
        self.queue: list[tuple[SessionEvent, int]] = []  # model: (event, bytes)
        self.closure: SessionEvent | None = None
        self.closed = False
        self.closure_delivered = False
        self.ended = False
        self.held: SessionEvent | None = None
        self.invalid: dict[int, SessionEvent] = {}  # events that must never be delivered (refs pin the ids)

    # -- producers ----------------------------------------------------------

    def _put(self, event: SessionEvent) -> None:
        size = utf8_len(PROJECTION.render_text(event))
        reserve = event.lane != ORDINARY
        max_events = self.buffer.max_events + (self.buffer.reserve_events if reserve else 0)
        max_bytes = self.buffer.max_bytes + (self.buffer.reserve_bytes if reserve else 0)
        fits = len(self.queue) + 1 <= max_events and sum(b for _, b in self.queue) + size <= max_bytes
        before = (self.buffer.pending_events, self.buffer.pending_bytes)
        try:
            accepted = self.buffer.put(event)
        except OutputOverflowError:
            assert not self.closed and not fits
            assert (self.buffer.pending_events, self.buffer.pending_bytes) == before
            return
        if self.closed:
            assert accepted is False
            return
        assert fits and accepted
        self.queue.append((event, size))

    @rule(response=RESPONSES, epoch=EPOCHS, samples=st.integers(0, 300))
    def put_audio(self, response: str, epoch: int, samples: int) -> None:
        self._put(
            AudioDelta(
                session_id="s",
                epoch=epoch,
                response_id=response,
                item_id="i",
                pcm=np.zeros(samples, np.float32),
                sample_rate=24000,
            )
        )

    @rule(response=RESPONSES, text=st.text(max_size=40))
    def put_transcript(self, response: str, text: str) -> None:
        self._put(TranscriptDelta(session_id="s", response_id=response, item_id="i", delta=text))

    @rule(response=RESPONSES)
    def put_response_done(self, response: str) -> None:
        self._put(ResponseDone(session_id="s", response_id=response, status="completed"))

    @rule(message=st.text(max_size=60))
    def put_error(self, message: str) -> None:
        self._put(ErrorEvent(session_id="s", code="x", message=message))

    @rule(details=st.integers(0, 6000))
    def close(self, details: int) -> None:
        closure = SessionClosed(session_id="s", reason="client_close", details={"d": "x" * details} if details else {})
        accepted = self.buffer.close(closure)
        assert accepted == (not self.closed)
        if not self.closed:
            self.closed = True
            self.closure = closure

    @rule(response=RESPONSES, through=EPOCHS)
    def invalidate(self, response: str, through: int) -> None:
        def matches(event: SessionEvent) -> bool:
            return isinstance(event, AudioDelta) and event.response_id == response and event.epoch <= through

        dropped = self.buffer.invalidate(response, through)
        kept = [(e, b) for e, b in self.queue if not matches(e)]
        assert dropped == len(self.queue) - len(kept)
        self.queue = kept
        if self.held is not None and matches(self.held):
            self.invalid[id(self.held)] = self.held

    # -- consumer -----------------------------------------------------------

    @precondition(lambda self: not self.ended and (self.queue or self.closed))
    @rule()
    def get(self) -> None:
        event = self.loop.run_until_complete(self.buffer.get())
        if self.queue:
            expected, _ = self.queue.pop(0)
            assert event is expected  # FIFO
            assert id(event) not in self.invalid
            self.held = event
        elif not self.closure_delivered and self.closure is not None:
            assert type(event) is SessionClosed and event.event_id == self.closure.event_id
            self.closure_delivered = True
            self.held = event
        else:
            assert event is None
            self.ended = True

    @precondition(lambda self: self.held is not None)
    @rule()
    def check_held(self) -> None:
        assert self.held is not None
        assert self.buffer.is_valid(self.held) == (id(self.held) not in self.invalid)

    # -- invariants ---------------------------------------------------------

    @invariant()
    def within_budget(self) -> None:
        assert self.buffer.pending_events <= self.buffer.max_events + self.buffer.reserve_events
        assert self.buffer.pending_bytes <= self.buffer.max_bytes + self.buffer.reserve_bytes
        assert self.buffer.pending_events == len(self.queue)
        assert self.buffer.pending_bytes == sum(b for _, b in self.queue)

    @invariant()
    def ended_stays_ended(self) -> None:
        if self.ended:
            assert self.loop.run_until_complete(self.buffer.get()) is None


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
