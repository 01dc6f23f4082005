"""The per-session output-overflow policy (docs/sessions.md#overflow-policy)."""

from __future__ import annotations

import pytest

from rtserve.sessions import SessionError
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.sessions.conftest import engine_session, names, of_type, read_to_end, settle, take_ready

CREATION = ["ResponseCreated", "ItemAdded", "OutputItemAdded", "ContentPartAdded"]


async def open_with_response(manager, engine, *, first_text: str = "abcdefghij"):
    handle = await manager.open()
    session = engine_session(engine, handle)
    handle.submit(cmd.ResponseCreate())
    await settle()
    response_id = session.responses[-1].response_id
    session.audio(response_id, samples=24000, text=first_text)
    events = await take_ready(handle.attachment)
    assert names(events) == ["SessionCreated", *CREATION, "AudioDelta", "TranscriptDelta"]
    return handle, session, response_id


async def test_output_overflow_closes_only_its_session_and_releases_capacity(engine, make_manager) -> None:
    manager = make_manager(engine, max_sessions=2, max_pending_output_events_per_session=8)
    slow, slow_engine, response_id = await open_with_response(manager, engine)
    normal = await manager.open()
    normal_engine = engine_session(engine, normal)
    normal.submit(cmd.ResponseCreate())
    await settle()

    for _ in range(5):  # the slow client reads nothing
        slow_engine.audio(response_id, samples=480)
    await settle()
    normal_engine.audio(normal_engine.responses[0].response_id, value=0.5)

    events = await read_to_end(slow.attachment)
    assert names(events) == ["TranscriptDelta"] * 4 + ["ErrorEvent", "ResponseDone", "SessionClosed"]
    error, done, closed = events[-3:]
    assert isinstance(error, ev.ErrorEvent) and isinstance(done, ev.ResponseDone)
    assert isinstance(closed, ev.SessionClosed)
    assert (error.code, error.error_type) == ("output_backpressure", "rate_limit_error")
    assert (done.response_id, done.status, done.committed) == (response_id, "failed", False)
    assert done.status_details == {"type": "failed", "reason": "output_backpressure"}
    assert done.output[0].text == "abcdefghij"  # identity and output are kept
    assert closed.reason == "output_backpressure"
    assert slow.history == ()
    assert slow_engine.close_calls == 1  # engine work stopped once

    normal_events = await take_ready(normal.attachment)
    [audio] = of_type(normal_events, ev.AudioDelta)
    assert float(audio.pcm[0]) == 0.5  # the other session is untouched
    assert manager.active_count() == 1
    await manager.open()  # the slot was released
    with pytest.raises(SessionError) as refused:  # an overflow-closed session cannot be resumed
        manager.resume(slow.session_id, resume_token=slow.resume_token, expected_generation=0, control_id="r")
    assert refused.value.code == "unknown_session"


@pytest.mark.parametrize(
    ("capacity", "outcome"), [(8, "active-overflow"), (14, "overflow-after-ending"), (64, "sufficient-capacity")]
)
async def test_completion_batch_retains_exactly_one_response_done(
    engine, make_manager, capacity: int, outcome: str
) -> None:
    manager = make_manager(engine, max_pending_output_events_per_session=capacity)
    handle, session, response_id = await open_with_response(manager, engine)
    for _ in range(4):
        session.audio(response_id, samples=480)
    await settle()
    assert handle._runner.outlet.buffer.pending_events == 8  # [AudioDelta, TranscriptDelta] x 4
    session.finish(response_id)
    await settle()
    events = (
        await read_to_end(handle.attachment)
        if outcome != "sufficient-capacity"
        else await take_ready(handle.attachment)
    )
    dones = of_type(events, ev.ResponseDone)
    assert len(dones) == 1  # exactly one ending, whatever happened
    if outcome == "active-overflow":
        assert names(events) == ["TranscriptDelta"] * 4 + ["ErrorEvent", "ResponseDone", "SessionClosed"]
        assert dones[0].status == "failed" and not dones[0].committed
        assert handle.history == ()
    elif outcome == "overflow-after-ending":
        assert names(events[:8]) == ["AudioDelta", "TranscriptDelta"] * 4, names(events)
        assert names(events[-3:]) == ["ResponseDone", "ErrorEvent", "SessionClosed"]
        assert dones[0].status == "completed"
        assert [m.content for m in handle.history] == ["abcdefghij"]  # an accepted ending keeps history
    else:
        assert isinstance(events[-2], ev.ResponseDone) and dones[0].status == "completed"
        assert isinstance(events[-1], ev.RateLimitsUpdated)
        assert of_type(events, ev.ErrorEvent) == []
        assert manager.get(handle.session_id) is not None


async def test_overflow_without_a_response_still_ends_with_error_and_closure(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_output_events_per_session=3)
    handle = await manager.open()
    for _ in range(5):
        handle.submit(cmd.Heartbeat())
    events = await read_to_end(handle.attachment)
    assert names(events) == ["SessionCreated", "HeartbeatAck", "HeartbeatAck", "ErrorEvent", "SessionClosed"]
    assert of_type(events, ev.ResponseDone) == []


async def test_late_engine_output_after_overflow_is_suppressed(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_output_events_per_session=8)
    handle, session, response_id = await open_with_response(manager, engine)
    for _ in range(6):
        session.audio(response_id, samples=480)
    events = await read_to_end(handle.attachment)
    assert isinstance(events[-1], ev.SessionClosed)
    assert of_type(events, ev.AudioDelta) == []
