"""Stateful property test of one whole session (runner + buffer + resume) against its
delivery invariants, under random commands, engine output, stale output, cancels,
overflows (small buffers, lazy reading), detach/resume and expiry:

* the output buffer is never over budget;
* every delivered sequence number appears exactly once, in order, with no gaps,
  even across resumes;
* exactly one terminal event, and it is the last;
* exactly one ``response.done`` per ``response.created``, and no audio of a response
  after its ``response.done``;
* epochs never go backwards in delivery order.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

import hypothesis
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rtserve.config import SessionLimits
from rtserve.sessions import SessionManager
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.clocks import FakeClock
from tests.sessions.engine_double import TestDoubleEngine

T = TypeVar("T")
SPEECH = np.full(2400, 0.1, dtype=np.float32)  # 100 ms: OpenAI's smallest commit


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    @initialize(capacity=st.integers(6, 40))
    def open(self, capacity: int) -> None:
        self.clock = FakeClock()
        self.engine = TestDoubleEngine()
        limits = SessionLimits(
            max_pending_output_events_per_session=capacity,
            idle_ttl_s=10.0,
            disconnect_grace_s=5.0,
            engine_close_timeout_s=0.5,
        )
        self.manager = SessionManager(self.engine, limits, clock=self.clock)
        self.handle = self.run(self.manager.open())
        assert self.handle.attachment is not None  # open() gives the first consumer
        self.attachment = self.handle.attachment
        self.session = self.engine.sessions[self.handle.session_id]
        self.delivered: list[ev.SessionEvent] = []
        self.last_seq = 0
        self.generation = 0
        self.resumes = 0

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            self.run(self._finish())
        self.loop.close()

    async def _finish(self) -> None:
        await self.handle.close()
        await self._read(10_000)
        await self.manager.shutdown()
        self._check_stream()
        leftover = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        assert leftover == []

    # -- helpers -------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return any(isinstance(e, ev.SessionClosed | ev.SessionExpired) for e in self.delivered)

    async def _read(self, limit: int) -> None:
        await _settle()
        buffer = self.handle._runner.outlet.buffer
        for _ in range(limit):
            a = self.attachment
            if not (a._preamble or a._replay or buffer.pending_events or (buffer.closed and not buffer.finished)):
                return
            delivery = await asyncio.wait_for(a.next_delivery(), 10)
            if delivery is None:
                return
            if delivery.seq is not None:
                self.delivered.append(delivery.event)
                self.last_seq = delivery.seq

    def _submit(self, command: cmd.Command) -> None:
        self.handle.submit(command)
        self.run(_settle())

    def _latest_response(self) -> str | None:
        return self.session.responses[-1].response_id if self.session.responses else None

    # -- rules ---------------------------------------------------------------

    @rule()
    def append(self) -> None:
        self._submit(cmd.AppendAudio(audio=SPEECH))

    @rule(respond=st.booleans())
    def commit(self, respond: bool) -> None:
        self._submit(cmd.Commit(response_create=respond))

    @rule()
    def response_create(self) -> None:
        self._submit(cmd.ResponseCreate())

    @rule(stale=st.booleans(), text=st.sampled_from(["", "ab", "héllo"]), samples=st.integers(1, 2000))
    def engine_audio(self, stale: bool, text: str, samples: int) -> None:
        response_id = self._latest_response()
        if response_id is not None:
            epoch = self.session.epoch - 1 if stale else self.session.epoch
            self.session.audio(response_id, samples=samples, text=text, epoch=epoch)
            self.run(_settle())

    @rule(status=st.sampled_from(["completed", "failed"]))
    def engine_finish(self, status: Literal["completed", "failed"]) -> None:
        response_id = self._latest_response()
        if response_id is not None:
            self.session.finish(response_id, status)
            self.run(_settle())

    @rule(kind=st.sampled_from(["cancel", "barge_in", "clear_output", "heartbeat"]))
    def control(self, kind: str) -> None:
        self._submit(
            {
                "cancel": cmd.ResponseCancel(),
                "barge_in": cmd.BargeIn(),
                "clear_output": cmd.Clear(target="output"),
                "heartbeat": cmd.Heartbeat(),
            }[kind]
        )

    @rule(n=st.integers(1, 50))
    def read(self, n: int) -> None:
        self.run(self._read(n))

    @precondition(lambda self: not self.ended)
    @rule()
    def detach_and_resume(self) -> None:
        self.run(self._detach_and_resume())

    async def _detach_and_resume(self) -> None:
        if not self.attachment.detach():
            return
        await _settle()
        handle = self.handle
        if self.manager.get(handle.session_id) is None:
            return  # it ended meanwhile (e.g. overflow)
        self.resumes += 1
        self.attachment = self.manager.resume(
            handle.session_id,
            resume_token=handle.resume_token,
            expected_generation=self.generation,
            control_id=f"resume-{self.resumes}",
            last_received_seq=self.last_seq,
        )
        self.generation = self.attachment.generation

    @rule()
    def idle_expiry(self) -> None:
        self.clock.advance(11.0)
        self.run(self.manager.reap_expired())

    # -- invariants ----------------------------------------------------------

    @invariant()
    def within_budget(self) -> None:
        buffer = self.handle._runner.outlet.buffer
        assert buffer.pending_events <= buffer.max_events + buffer.reserve_events
        assert buffer.pending_bytes <= buffer.max_bytes + buffer.reserve_bytes

    def _check_stream(self) -> None:
        events = self.delivered
        seqs = [e.server_event_seq for e in events]
        assert seqs == list(range(1, len(events) + 1)), "sequence numbers must be gap-free and unique"
        terminals = [e for e in events if isinstance(e, ev.SessionClosed | ev.SessionExpired)]
        assert len(terminals) == 1 and events[-1] is terminals[0]
        hypothesis.event(f"ended: {terminals[0].reason}")
        hypothesis.event(f"resumed: {min(self.resumes, 2)}")
        hypothesis.event(f"responses: {min(sum(isinstance(e, ev.ResponseDone) for e in events), 3)}")
        created = Counter(e.response_id for e in events if isinstance(e, ev.ResponseCreated))
        done = Counter(e.response_id for e in events if isinstance(e, ev.ResponseDone))
        assert created == done, "exactly one response.done per response"
        finished: set[str] = set()
        epoch = 0
        for event in events:
            assert event.epoch >= epoch
            epoch = event.epoch
            if isinstance(event, ev.ResponseDone):
                finished.add(event.response_id)
            if isinstance(event, ev.AudioDelta):
                assert event.response_id not in finished, "audio after the response ended"


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
