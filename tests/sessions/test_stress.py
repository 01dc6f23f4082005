"""500 concurrent sessions with random cancels, overflows, resumes, closes and expiries
on a fake clock: afterwards no task, slot, buffer or runner may be left behind, and every
session that opened saw exactly one terminal event, last."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref

import numpy as np

from rtserve.config import SessionLimits
from rtserve.sessions import SessionError, SessionManager
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.clocks import FakeClock
from tests.sessions.engine_double import TestDoubleEngine

SESSIONS = 500
SPEECH = np.full(2400, 0.1, dtype=np.float32)  # 100 ms: OpenAI's smallest commit


async def _yield(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_500_sessions_leak_nothing() -> None:
    rng = random.Random(1234)
    clock = FakeClock()
    engine = TestDoubleEngine()
    limits = SessionLimits(
        max_sessions=450,
        max_pending_output_events_per_session=24,
        idle_ttl_s=30.0,
        disconnect_grace_s=5.0,
        engine_close_timeout_s=0.5,
    )
    manager = SessionManager(engine, limits, clock=clock)
    await manager.start()
    buffers: list[weakref.ref] = []
    outcomes: dict[str, list[ev.SessionEvent]] = {}
    refused = 0
    ended_detached: set[str] = set()
    counts = {"resumed": 0, "open_cancelled": 0}

    async def consume(session_id: str, attachment, lazy: bool) -> None:
        events = outcomes.setdefault(session_id, [])
        while True:
            if lazy:
                await _yield(20)  # a slow reader: its buffer may overflow
            delivery = await attachment.next_delivery()
            if delivery is None:
                return
            if delivery.seq is not None:
                events.append(delivery.event)

    async def life(i: int) -> None:
        nonlocal refused
        r = random.Random(rng.random())
        await _yield(r.randrange(5))
        open_task = asyncio.ensure_future(manager.open())
        if r.random() < 0.05:  # the caller gives up while the open is in flight
            await asyncio.sleep(0)
            open_task.cancel()
        try:
            handle = await open_task
        except SessionError as exc:
            assert exc.code == "resource_exhausted"
            refused += 1
            return
        except asyncio.CancelledError:
            counts["open_cancelled"] += 1
            return
        buffers.append(weakref.ref(handle._runner.outlet.buffer))
        session = engine.sessions[handle.session_id]
        readers = [asyncio.ensure_future(consume(handle.session_id, handle.attachment, r.random() < 0.2))]
        generation = 0
        for step in range(r.randrange(4, 14)):
            action = r.random()
            if action < 0.25:
                handle.submit(cmd.AppendAudio(audio=SPEECH))
                handle.submit(cmd.Commit(response_create=r.random() < 0.7))
            elif action < 0.55 and session.responses:
                response_id = session.responses[-1].response_id
                for _ in range(r.randrange(1, 12)):
                    session.audio(response_id, samples=480, text="w")
                if r.random() < 0.5:
                    session.finish(response_id)
            elif action < 0.65:
                handle.submit(r.choice([cmd.ResponseCancel(), cmd.BargeIn(), cmd.Clear(target="output")]))
            elif action < 0.75 and handle.attachment is not None:
                current = readers[-1]
                if manager.detach(handle.session_id, generation):
                    await current
                    try:
                        attachment = manager.resume(
                            handle.session_id,
                            resume_token=handle.resume_token,
                            expected_generation=generation,
                            control_id=f"{i}-{step}",
                            last_received_seq=len(outcomes[handle.session_id]),
                        )
                    except SessionError as exc:
                        assert exc.code == "unknown_session"  # it ended while detached: nobody sees the end
                        ended_detached.add(handle.session_id)
                        break
                    generation = attachment.generation
                    counts["resumed"] += 1
                    readers.append(asyncio.ensure_future(consume(handle.session_id, attachment, False)))
            else:
                handle.submit(cmd.Heartbeat())
            await _yield(r.randrange(1, 6))
        ending = r.random()
        if ending < 0.6:
            await handle.close()
        elif ending < 0.8:
            handle.submit(cmd.Close())
        # else: left idle, the reaper expires it
        await asyncio.gather(*readers[:-1])
        pending_readers.append(readers[-1])

    pending_readers: list[asyncio.Future[None]] = []
    await asyncio.gather(*(life(i) for i in range(SESSIONS)))
    assert limits.idle_ttl_s is not None
    for _ in range(3):  # idle sessions expire on the fake clock
        clock.advance(limits.idle_ttl_s)
        await _yield(50)
    await asyncio.wait_for(asyncio.gather(*pending_readers), 30)
    await manager.shutdown()

    assert refused > 0 and counts["resumed"] > 0 and counts["open_cancelled"] > 0  # all paths exercised
    assert manager.stats() == {"opening": 0, "live": 0, "closing": 0, "cleanup_pending": 0, "background_tasks": 0}
    assert manager.active_count() == 0
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    assert all(s.closed for s in engine.sessions.values())  # every engine session was released
    reasons = set()
    for session_id, events in outcomes.items():
        if session_id in ended_detached:
            continue
        terminals = [e for e in events if isinstance(e, ev.SessionClosed | ev.SessionExpired)]
        assert len(terminals) == 1 and events[-1] is terminals[0], session_id
        assert [e.server_event_seq for e in events] == list(range(1, len(events) + 1)), session_id
        reasons.add(terminals[0].reason)
    assert {"client_close", "output_backpressure", "idle_ttl_expired"} <= reasons
    outcomes.clear()  # drop the events and readers that hold on to the sessions' objects
    pending_readers.clear()
    gc.collect()
    assert [b for b in buffers if b() is not None] == []  # no buffer outlives its session
