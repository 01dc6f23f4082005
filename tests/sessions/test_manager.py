"""SessionManager behaviour: admission, dispatch, close paths, reaper, shutdown
(docs/sessions.md#lifecycle, docs/sessions.md#input-backpressure, docs/sessions.md#reaper)."""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

from rtserve.engines.errors import EngineError
from rtserve.sessions import SessionConfig, SessionError
from rtserve.sessions import commands as cmd
from rtserve.sessions.events import ErrorEvent, HeartbeatAck, SessionClosed, SessionCreated, SessionExpired
from rtserve.sessions.projections import RealtimeProjection
from tests.sessions.conftest import engine_session, names, of_type, read_to_end, read_until, settle, take_ready


def no_audio() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


def frames_of(size: int) -> tuple[str, ...]:
    return ("x" * size,)


# -- open -------------------------------------------------------------------------


async def test_open_answers_with_capabilities_and_emits_session_created(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open(SessionConfig(voice="alloy", instructions="be brief"))
    assert re.fullmatch(r"duplex-[0-9a-f]{32}", handle.session_id)
    assert handle.capabilities is engine.capabilities
    [created] = await take_ready(handle.attachment)
    assert isinstance(created, SessionCreated)
    assert created.epoch == 0
    assert created.session.id == handle.session_id
    assert created.session.config.voice == "alloy"
    assert created.session.capabilities["engine"] == "test-double-turn"
    assert created.server_event_seq == 1
    wire = RealtimeProjection("ga").render(created)
    assert wire["session"]["id"] == handle.session_id
    assert wire["session"]["audio"]["output"]["voice"] == "alloy"
    assert wire["session"]["capabilities"]["supports_barge_in"] is True
    assert wire["resume_token"] == handle.resume_token
    # the engine got the persona and the voice
    options = engine_session(engine, handle).options
    assert (options.prompt.text, options.prompt.voice) == ("be brief", "alloy")


async def test_a_front_ends_sessions_carry_its_tag_and_a_drain_admits_none_until_idle(engine, make_manager) -> None:
    manager = make_manager(engine)
    manager.owner = "0a1b2c3d"
    handle = await manager.open(SessionConfig())
    assert re.fullmatch(r"duplex-0a1b2c3d-[0-9a-f]{32}", handle.session_id)  # web/peers reads the owner here
    manager.drain()
    with pytest.raises(SessionError) as refused:
        await manager.open(SessionConfig())
    assert refused.value.code == "server_shutting_down" and "draining" in refused.value.message
    idle = asyncio.ensure_future(manager.wait_idle())
    await settle()
    assert not idle.done()  # the open session still holds its slot
    await handle.close()
    await asyncio.wait_for(idle, 5)
    assert manager.active_count() == 0


async def test_engine_rejection_rolls_back_the_open_completely(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    engine.open_error = EngineError("voice 'nope' is not installed", code="invalid_voice")
    with pytest.raises(SessionError) as refused:
        await manager.open(SessionConfig(voice="nope"))
    assert refused.value.code == "invalid_voice"
    assert manager.active_count() == 0
    engine.open_error = None
    handle = await manager.open(SessionConfig(voice="alloy"))  # the slot was given back
    assert manager.active_count() == 1
    assert names(await take_ready(handle.attachment)) == ["SessionCreated"]


async def test_concurrent_opens_cannot_exceed_max_sessions(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=2)
    engine.open_gate = asyncio.Event()
    opens = [asyncio.ensure_future(manager.open()) for _ in range(5)]
    await settle()
    refused = [t for t in opens if t.done()]
    assert len(refused) == 3  # refused at once, not queued
    for task in refused:
        assert isinstance(task.exception(), SessionError)
        assert task.exception().code == "resource_exhausted"
    engine.open_gate.set()
    handles = await asyncio.gather(*[t for t in opens if t not in refused])
    assert len({h.session_id for h in handles}) == 2
    assert manager.active_count() == 2


async def test_engine_capacity_exhaustion_is_resource_exhausted(make_manager) -> None:
    from tests.sessions.engine_double import TestDoubleEngine

    engine = TestDoubleEngine(max_sessions=1)
    manager = make_manager(engine, max_sessions=4)
    await manager.open()
    with pytest.raises(SessionError) as refused:
        await manager.open()
    assert refused.value.code == "resource_exhausted"
    assert manager.active_count() == 1


async def test_an_open_cancelled_after_admission_releases_its_engine_session(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    gate = engine.block_next_open()
    opener = asyncio.ensure_future(manager.open())
    await settle()
    assert manager.active_count() == 1
    opener.cancel()
    await settle()
    gate.set()  # the engine finishes opening after the caller left
    await settle()
    [session] = engine.sessions.values()
    assert session.close_calls == 1 and session.closed
    assert manager.active_count() == 0
    assert manager.stats()["background_tasks"] == 0
    await manager.open()  # the slot is free again


async def test_an_open_cancelled_again_during_its_rollback_leaves_the_engine_clean(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    gate = engine.block_next_open()
    engine.close_gate = asyncio.Event()
    opener = asyncio.ensure_future(manager.open())
    await settle()
    opener.cancel()
    gate.set()
    await settle()
    opener.cancel()  # a second cancellation while the rollback waits for engine cleanup
    [session] = engine.sessions.values()
    assert session.close_calls == 1 and manager.active_count() == 1
    engine.close_gate.set()
    await settle()
    assert session.closed and manager.active_count() == 0


async def test_control_dispatch_is_ordered_per_session_without_blocking_other_sessions(engine, make_manager) -> None:
    manager = make_manager(engine)
    gate = engine.block_next_open()
    slow_open = asyncio.ensure_future(manager.open())
    await settle()
    fast = await manager.open()  # not delayed by the slow open
    assert not slow_open.done()
    for i in range(3):
        fast.submit(cmd.Heartbeat(event_id=f"hb{i}"))
    events = await take_ready(fast.attachment)
    assert names(events) == ["SessionCreated", "HeartbeatAck", "HeartbeatAck", "HeartbeatAck"]
    gate.set()
    slow = await slow_open
    assert names(await take_ready(slow.attachment)) == ["SessionCreated"]


# -- dispatch ---------------------------------------------------------------------


async def test_command_for_unknown_session_emits_unknown_session_error(engine, make_manager) -> None:
    orphans: list = []
    manager = make_manager(engine)
    manager.orphan_sink = orphans.append
    error = manager.submit("duplex-nope", cmd.Heartbeat(event_id="evt_7"))
    assert isinstance(error, ErrorEvent)
    assert (error.code, error.related_event_id) == ("unknown_session", "evt_7")
    assert orphans == [error]


async def test_command_for_closed_session_emits_unknown_session_error(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    await handle.close()
    error = handle.submit(cmd.Heartbeat(event_id="late"))
    assert error is not None and error.code == "unknown_session" and error.related_event_id == "late"
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "SessionClosed"]  # the refusal is not on the finished stream


async def test_admitted_commands_reach_the_runner_in_order_and_refresh_the_lease(engine, make_manager, clock) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    clock.advance(5.0)
    assert handle.submit(cmd.Heartbeat(event_id="a")) is None
    assert handle.submit(cmd.Heartbeat(event_id="b")) is None
    events = await take_ready(handle.attachment)
    acks = of_type(events, HeartbeatAck)
    assert len(acks) == 2 and all(a.epoch == 0 for a in acks)
    assert manager._live[handle.session_id].lease.last_activity == 5.0


async def test_append_audio_is_backpressured_by_pending_input_bytes(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_input_bytes_per_session=8)
    handle = await manager.open()
    gate = handle._runner.gate
    # No await between submits: the runner has not dequeued anything yet.
    assert handle.submit(cmd.AppendAudio(audio=no_audio(), video_frames=frames_of(6))) is None
    assert gate.pending_input_bytes == 6
    refused = handle.submit(cmd.AppendAudio(audio=no_audio(), video_frames=frames_of(3), event_id="big"))
    assert refused is not None and refused.code == "input_backpressure" and refused.related_event_id == "big"
    assert handle.submit(cmd.AppendAudio(audio=no_audio(), video_frames=frames_of(2))) is None  # 6 + 2 <= 8
    assert gate.pending_input_bytes == 8
    events = await take_ready(handle.attachment)
    assert gate.pending_input_bytes == 0  # released when the runner dequeued them
    assert [e.code for e in of_type(events, ErrorEvent)] == ["input_backpressure"]  # also on the stream
    assert handle.submit(cmd.AppendAudio(audio=np.zeros(2, np.float32))) is None  # usable again: 8 bytes


async def test_append_admission_counts_audio_and_video_frame_bytes(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_input_bytes_per_session=20)
    handle = await manager.open()
    assert handle.submit(cmd.AppendAudio(audio=np.zeros(1, np.float32))) is None  # 4 bytes reserved
    append = cmd.AppendAudio(audio=np.zeros(2, np.float32), video_frames=frames_of(10), event_id="v1")
    assert append.input_bytes == 18
    refused = handle.submit(append)  # 4 + 18 > 20
    assert refused is not None and refused.related_event_id == "v1"
    assert handle._runner.gate.pending_input_bytes == 4
    await settle()
    assert len(engine_session(engine, handle).pushed) == 1  # the refused append never reached the engine


async def test_commit_holds_a_pending_turn_reservation_until_the_runner_dequeues_it(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_turns_per_session=1)
    handle = await manager.open()
    gate = handle._runner.gate
    assert handle.submit(cmd.Commit()) is None
    assert gate.pending_input_turns == 1
    refused = handle.submit(cmd.Commit(event_id="c2"))
    assert refused is not None and refused.code == "input_backpressure"
    await settle()  # the runner dequeues the first commit: its reservation is released
    assert gate.pending_input_turns == 0
    assert handle.submit(cmd.Commit()) is None
    assert gate.pending_input_turns == 1


async def test_a_full_mailbox_refuses_commands_without_losing_the_session(engine, make_manager) -> None:
    manager = make_manager(engine, mailbox_size=2)
    handle = await manager.open()
    assert handle.submit(cmd.Heartbeat()) is None
    assert handle.submit(cmd.Heartbeat()) is None
    refused = handle.submit(cmd.Heartbeat(event_id="third"))
    assert refused is not None and refused.code == "input_backpressure"
    events = await take_ready(handle.attachment)
    assert len(of_type(events, HeartbeatAck)) == 2
    assert handle.submit(cmd.Heartbeat()) is None


# -- close paths ------------------------------------------------------------------


async def test_close_releases_engine_resources_and_is_idempotent(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    session = engine_session(engine, handle)
    assert await handle.close() == 0
    assert session.close_calls == 1 and session.closed
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "SessionClosed"]
    assert isinstance(events[-1], SessionClosed) and events[-1].reason == "client_close"
    assert await handle.close() is None  # no events, no cleanup calls
    assert session.close_calls == 1
    assert await manager.close("duplex-forgotten") is None
    assert manager.active_count() == 0


async def test_close_retains_the_admission_slot_until_engine_cleanup_succeeds(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    handle = await manager.open()
    await take_ready(handle.attachment)
    engine.sessions[handle.session_id].close_gate = gate = asyncio.Event()
    closing = asyncio.ensure_future(handle.close())
    await settle()
    assert manager.get(handle.session_id) is None  # no longer dispatchable
    assert await take_ready(handle.attachment) == []  # no terminal while cleanup is blocked
    with pytest.raises(SessionError) as refused:
        await manager.open()
    assert refused.value.code == "resource_exhausted"
    gate.set()
    await closing
    [closed] = await take_ready(handle.attachment)
    assert isinstance(closed, SessionClosed)
    await manager.open()  # admitted right after session.closed


async def test_the_slot_is_already_free_when_session_closed_reaches_the_client(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    handle = await manager.open()

    async def slots_when_closed_arrives() -> int:
        async for event in handle.attachment:
            if isinstance(event, SessionClosed):
                return manager.active_count()  # observed in the same step the client sees the event
        raise AssertionError("stream ended without session.closed")

    watcher = asyncio.ensure_future(slots_when_closed_arrives())
    await settle()
    handle.submit(cmd.Close())
    assert await asyncio.wait_for(watcher, 10) == 0
    await manager.open()


async def test_wire_close_frees_dispatch_at_once_and_stops_the_worker(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    handle = await manager.open()
    assert handle.submit(cmd.Close()) is None
    assert manager.get(handle.session_id) is None
    later = handle.submit(cmd.Heartbeat(event_id="after-close"))
    assert later is not None and later.code == "unknown_session"
    events = await read_until(handle.attachment, SessionClosed)
    assert names(events) == ["SessionCreated", "SessionClosed"]
    await settle()
    assert handle._runner._main.done()
    await manager.open()  # the slot is free


async def test_runtime_close_without_engine_resources_frees_the_slot(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=1)
    handle = await manager.open()
    engine_session(engine, handle).end_stream()
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "SessionClosed"]
    assert isinstance(events[-1], SessionClosed) and events[-1].reason == "engine_closed"
    assert manager.active_count() == 0


async def test_a_runtime_close_racing_a_manager_close_still_emits_one_terminal(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    engine_session(engine, handle).end_stream()
    closing = asyncio.ensure_future(handle.close())
    events = await read_to_end(handle.attachment)
    await closing
    assert len(of_type(events, SessionClosed)) == 1 and isinstance(events[-1], SessionClosed)


async def test_a_terminal_event_is_emitted_once_even_if_expiry_runs_twice(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    results = await asyncio.gather(
        manager.expire(handle.session_id, "request_cleanup"), manager.expire(handle.session_id, "request_cleanup")
    )
    assert sorted(results) == [False, True]
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "SessionExpired"]


async def test_expiry_after_a_pending_close_still_ends_with_exactly_one_terminal(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    engine_session(engine, handle).close_gate = gate = asyncio.Event()
    closing = asyncio.ensure_future(handle.close())
    await settle()
    assert await manager.expire(handle.session_id, "request_cleanup") is False  # already closing
    gate.set()
    await closing
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "SessionClosed"]


async def test_request_cleanup_expires_the_owner(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    assert await manager.expire(handle.session_id, "request_cleanup")
    events = await read_to_end(handle.attachment)
    assert isinstance(events[-1], SessionExpired) and events[-1].reason == "request_cleanup"
    assert manager._closing == {} and manager.active_count() == 0


# -- reaper -----------------------------------------------------------------------


async def test_reaper_expires_idle_sessions_and_emits_session_expired(engine, make_manager, clock) -> None:
    manager = make_manager(engine, idle_ttl_s=2.0)
    idle = await manager.open()
    active = await manager.open()
    clock.advance(1.0)
    active.submit(cmd.Heartbeat())
    clock.advance(1.1)
    assert await manager.reap_expired() == 1
    events = await read_to_end(idle.attachment)
    assert names(events) == ["SessionCreated", "SessionExpired"]
    wire = RealtimeProjection("ga").render_text(events[-1])
    assert f'"session_id":"{idle.session_id}","reason":"idle_ttl_expired"' in wire
    assert engine_session(engine, idle).closed
    assert not engine_session(engine, active).closed
    assert names(await take_ready(active.attachment)) == ["SessionCreated", "HeartbeatAck"]
    assert manager.get(active.session_id) is not None


async def test_reaper_loop_runs_on_the_injected_clock(engine, make_manager, clock) -> None:
    manager = make_manager(engine, idle_ttl_s=2.0, reaper_interval_s=1.0)
    await manager.start()
    handle = await manager.open()
    for _ in range(3):
        clock.advance(1.0)
        await settle()
    events = await read_to_end(handle.attachment)
    assert isinstance(events[-1], SessionExpired) and events[-1].reason == "idle_ttl_expired"


async def test_reaper_expires_detached_sessions_after_the_disconnect_grace(engine, make_manager, clock) -> None:
    manager = make_manager(engine, idle_ttl_s=300.0, disconnect_grace_s=1.0)
    handle = await manager.open()
    assert handle.attachment.detach()
    clock.advance(0.5)
    assert await manager.reap_expired() == 0
    clock.advance(0.6)
    assert await manager.reap_expired() == 1
    with pytest.raises(SessionError) as refused:
        manager.resume(handle.session_id, resume_token=handle.resume_token, expected_generation=0, control_id="r1")
    assert refused.value.code == "unknown_session"


async def test_expired_session_retains_the_admission_slot_until_cleanup_succeeds(engine, make_manager, clock) -> None:
    manager = make_manager(engine, max_sessions=1, idle_ttl_s=1.0)
    engine.close_failures = 1
    handle = await manager.open()
    clock.advance(1.5)
    assert await manager.reap_expired() == 0  # expired, but cleanup failed
    assert manager.get(handle.session_id) is None
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "SessionExpired"]
    with pytest.raises(SessionError) as refused:
        await manager.open()
    assert refused.value.code == "resource_exhausted"
    assert await manager.reap_expired() == 1  # the retry succeeds, without a new event
    assert engine_session(engine, handle).close_calls == 2
    assert manager.active_count() == 0
    await manager.open()


async def test_stuck_cleanup_does_not_block_other_sessions(engine, make_manager, clock) -> None:
    manager = make_manager(engine, idle_ttl_s=1.0, engine_close_timeout_s=0.05)
    stuck = await manager.open()
    good = await manager.open()
    engine_session(engine, stuck).close_hangs = True
    clock.advance(1.5)
    assert await manager.reap_expired() == 1  # only the good one is finalised
    for handle in (stuck, good):
        events = await read_to_end(handle.attachment)
        assert isinstance(events[-1], SessionExpired)
    assert manager.active_count() == 1  # the stuck session still holds its slot
    assert await manager.reap_expired() == 0  # still stuck: retried, no duplicate events


# -- shutdown ---------------------------------------------------------------------


async def test_shutdown_closes_every_session_and_stops_every_task(engine, make_manager) -> None:
    manager = make_manager(engine)
    await manager.start()
    handles = [await manager.open() for _ in range(3)]
    engine_session(engine, handles[0]).close_hangs = True  # even a stuck cleanup cannot hold shutdown
    manager.limits.shutdown_timeout_s = 0.2
    await manager.shutdown()
    for handle in handles:
        events = await read_to_end(handle.attachment)
        assert isinstance(events[-1], SessionClosed) and events[-1].reason == "shutdown"
    assert manager.active_count() == 0
    assert manager.stats() == {"opening": 0, "live": 0, "closing": 0, "cleanup_pending": 0, "background_tasks": 0}
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    with pytest.raises(SessionError) as refused:
        await manager.open()
    assert refused.value.code == "server_shutting_down"


async def test_wire_json_of_refusals_names_the_client_event(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_turns_per_session=1)
    handle = await manager.open()
    handle.submit(cmd.Commit())
    refused = handle.submit(cmd.Commit(event_id="evt_42"))
    wire = json.loads(RealtimeProjection("ga").render_text(refused))
    assert wire["type"] == "error"
    assert wire["error"] == {
        "type": "rate_limit_error",
        "code": "input_backpressure",
        "message": refused.message,
        "param": None,
        "event_id": "evt_42",
    }


async def test_metrics_are_registered_on_the_given_registry(engine, clock) -> None:
    from prometheus_client import CollectorRegistry

    from rtserve.config import SessionLimits
    from rtserve.sessions import SessionManager

    registry = CollectorRegistry()
    manager = SessionManager(
        engine, SessionLimits(max_sessions=1, max_pending_turns_per_session=1), clock=clock, registry=registry
    )
    handle = await manager.open()
    assert registry.get_sample_value("rtserve_sessions_slots_in_use") == 1
    with pytest.raises(SessionError):
        await manager.open()
    handle.submit(cmd.Commit())
    handle.submit(cmd.Commit())
    await handle.close()
    assert registry.get_sample_value("rtserve_sessions_opened_total") == 1
    assert registry.get_sample_value("rtserve_sessions_refused_total", {"code": "resource_exhausted"}) == 1
    assert registry.get_sample_value("rtserve_session_input_backpressure_total") == 1
    assert registry.get_sample_value("rtserve_sessions_ended_total", {"kind": "closed", "reason": "client_close"}) == 1
    assert registry.get_sample_value("rtserve_sessions_slots_in_use") == 0
    await manager.shutdown()
