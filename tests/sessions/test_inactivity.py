"""The inactivity timeout (``sessions.inactivity_timeout_s``, docs/sessions.md#close-and-expiry):
a session with no client event, no work in progress and no unsent output ends with
``session_idle_timeout``; each kind of activity holds it. Time moves only by the fake clock."""

from __future__ import annotations

import asyncio

import numpy as np

from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.sessions.conftest import engine_session, names, of_type, settle, take_ready
from tests.sessions.engine_double import TestDoubleEngine

TIMEOUT_S = 300.0
SPEECH = np.full(2400, 0.1, dtype=np.float32)  # 100 ms at 24 kHz


async def open_session(make_manager, engine, **limits):
    manager = make_manager(engine, inactivity_timeout_s=TIMEOUT_S, **limits)
    handle = await manager.open()
    await take_ready(handle.attachment)  # SessionCreated
    return manager, handle


async def advance(clock, seconds: float) -> None:
    clock.advance(seconds)
    await settle()


def assert_timed_out(events: list[ev.SessionEvent]) -> None:
    assert names(events)[-2:] == ["ErrorEvent", "SessionExpired"]
    error, expired = events[-2:]
    assert isinstance(error, ev.ErrorEvent) and isinstance(expired, ev.SessionExpired)
    assert (error.code, error.error_type) == ("session_idle_timeout", "invalid_request_error")
    assert expired.reason == "session_idle_timeout" and expired.details == {"inactivity_timeout_s": TIMEOUT_S}


async def test_a_silent_session_ends_after_the_timeout_and_frees_its_slot(engine, make_manager, clock) -> None:
    manager, handle = await open_session(make_manager, engine)
    await advance(clock, TIMEOUT_S - 1)
    assert manager.active_count() == 1 and not await take_ready(handle.attachment)
    await advance(clock, 1)
    assert_timed_out(await take_ready(handle.attachment))
    assert manager.active_count() == 0 and engine_session(engine, handle).closed
    assert manager.metrics.ended.labels("expired", "session_idle_timeout")._value.get() == 1


async def test_input_audio_and_any_client_event_restart_the_wait(engine, make_manager, clock) -> None:
    manager, handle = await open_session(make_manager, engine)
    await advance(clock, 200)
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    await advance(clock, 200)
    handle.submit(cmd.SessionUpdate(changes={"instructions": "Be brief."}))
    await take_ready(handle.attachment)  # session.updated
    await advance(clock, TIMEOUT_S - 1)
    assert manager.active_count() == 1
    await advance(clock, 1)
    assert_timed_out(await take_ready(handle.attachment))
    assert manager.active_count() == 0


async def test_a_response_in_progress_holds_it_and_its_end_restarts_the_wait(engine, make_manager, clock) -> None:
    manager, handle = await open_session(make_manager, engine)
    handle.submit(cmd.ResponseCreate())
    await settle()
    session = engine_session(engine, handle)
    response_id = session.responses[-1].response_id
    await take_ready(handle.attachment)
    await advance(clock, TIMEOUT_S * 3)  # a long answer, the client silent and reading
    assert manager.active_count() == 1
    session.finish(response_id)
    await take_ready(handle.attachment)
    await advance(clock, TIMEOUT_S - 1)
    assert manager.active_count() == 1
    await advance(clock, 1)
    assert_timed_out(await take_ready(handle.attachment))


async def test_output_the_client_has_not_read_holds_it(engine, make_manager, clock) -> None:
    manager, handle = await open_session(make_manager, engine)
    handle.submit(cmd.ResponseCreate())
    await settle()
    session = engine_session(engine, handle)
    session.audio(session.responses[-1].response_id, text="Hello")
    session.finish(session.responses[-1].response_id)
    await settle()  # the answer is queued, not read
    await advance(clock, TIMEOUT_S * 2)
    assert manager.active_count() == 1
    events = await take_ready(handle.attachment)
    assert of_type(events, ev.ResponseDone) and not of_type(events, ev.SessionExpired)
    await advance(clock, TIMEOUT_S)  # read: now nothing holds it
    assert_timed_out(await take_ready(handle.attachment))


async def test_a_turn_waiting_for_its_transcript_holds_it(engine, make_manager, clock) -> None:
    manager, handle = await open_session(make_manager, engine)
    session = engine_session(engine, handle)
    session.commit_gate = asyncio.Event()  # the engine is still transcribing the turn
    handle.submit(cmd.AppendAudio(audio=SPEECH))
    handle.submit(cmd.Commit())
    await take_ready(handle.attachment)
    await advance(clock, TIMEOUT_S * 2)
    assert manager.active_count() == 1
    session.commit_gate.set()
    await take_ready(handle.attachment)  # the transcript
    await advance(clock, TIMEOUT_S)
    assert_timed_out(await take_ready(handle.attachment))


async def test_a_lockstep_stream_without_client_input_ends(make_manager, clock) -> None:
    """The eternal response of a lockstep session is not work in progress."""
    lockstep = TestDoubleEngine(mode="lockstep", supports_barge_in=False, supports_server_vad=False)
    manager, handle = await open_session(make_manager, lockstep)
    frame = lockstep.capabilities.input_frame_samples
    handle.submit(cmd.AppendAudio(audio=np.zeros(frame, dtype=np.float32)))
    await take_ready(handle.attachment)  # the eternal response started and its frame was read
    await advance(clock, TIMEOUT_S)
    events = await take_ready(handle.attachment)
    assert of_type(events, ev.ErrorEvent)[0].code == "session_idle_timeout"
    assert isinstance(events[-1], ev.SessionExpired) and manager.active_count() == 0


async def test_null_disables_it(engine, make_manager, clock) -> None:
    manager = make_manager(engine, inactivity_timeout_s=None)
    await manager.open()
    await advance(clock, TIMEOUT_S * 100)
    assert manager.active_count() == 1
