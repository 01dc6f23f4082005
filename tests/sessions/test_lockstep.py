"""Continuous (lockstep) sessions: one eternal response (docs/sessions.md#lockstep-sessions)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.sessions.conftest import engine_session, names, of_type, read_to_end, settle, take_ready
from tests.sessions.engine_double import TestDoubleEngine

FRAME = 1920  # 80 ms at 24 kHz


@pytest.fixture
def lockstep() -> TestDoubleEngine:
    return TestDoubleEngine(mode="lockstep", supports_barge_in=False, supports_server_vad=False)


def frames(n: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, int(n * FRAME)).astype(np.float32)


async def test_one_eternal_response_created_on_first_input_and_done_once_at_close(lockstep, make_manager) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    assert names(await take_ready(handle.attachment)) == ["SessionCreated"]  # nothing at open
    signal = frames(4)
    handle.submit(cmd.AppendAudio(audio=signal[: 2 * FRAME]))
    handle.submit(cmd.AppendAudio(audio=signal[2 * FRAME :]))
    await settle()
    await handle.close()
    events = await read_to_end(handle.attachment)
    assert len(of_type(events, ev.ResponseCreated)) == 1
    assert len(of_type(events, ev.ResponseDone)) == 1
    assert of_type(events, ev.ResponseDone)[0].status == "completed"
    audio = of_type(events, ev.AudioDelta)
    assert len(audio) == 4 and all(len(a.pcm) == FRAME for a in audio)  # one whole frame per input frame
    np.testing.assert_allclose(np.concatenate([a.pcm for a in audio]), signal * 0.5)  # in lockstep order
    assert [t.delta for t in of_type(events, ev.TranscriptDelta)] == ["w", "w"]  # only frames with text
    assert len({a.response_id for a in audio}) == 1
    assert isinstance(events[-1], ev.SessionClosed)


async def test_close_with_no_input_ever_emits_no_response(lockstep, make_manager) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    await handle.close()
    assert names(await read_to_end(handle.attachment)) == ["SessionCreated", "SessionClosed"]


@pytest.mark.parametrize(("chunks", "expected_frames"), [((2.5, 0.5), 3), ((0.5,), 1)])
async def test_unaligned_input_is_reframed_and_the_partial_tail_is_stepped_at_close(
    lockstep, make_manager, chunks: tuple[float, ...], expected_frames: int
) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    for i, size in enumerate(chunks):
        handle.submit(cmd.AppendAudio(audio=frames(size, seed=i)))
    await settle()
    await handle.close()
    events = await read_to_end(handle.attachment)
    audio = of_type(events, ev.AudioDelta)
    assert len(audio) == expected_frames  # never dropped: the tail is zero-padded and stepped
    assert names(events)[-3:] == ["ResponseDone", "RateLimitsUpdated", "SessionClosed"]
    assert events.index(audio[-1]) < events.index(of_type(events, ev.ResponseDone)[0])


async def test_cancel_advances_the_epoch_but_the_stream_keeps_flowing(lockstep, make_manager) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    session = engine_session(lockstep, handle)
    handle.submit(cmd.AppendAudio(audio=frames(1)))
    await settle()
    handle.submit(cmd.ResponseCancel())
    handle.submit(cmd.AppendAudio(audio=frames(2, seed=1)))
    await settle()
    await handle.close()
    events = await read_to_end(handle.attachment)
    assert session.epochs == [1] and handle.epoch == 1
    assert len(of_type(events, ev.ResponseCreated)) == 1 and len(of_type(events, ev.ResponseDone)) == 1
    after_cancel = [a for a in of_type(events, ev.AudioDelta) if a.epoch == 1]
    assert len(after_cancel) == 2  # audio continues in the new epoch, same response
    assert len({a.response_id for a in of_type(events, ev.AudioDelta)}) == 1


async def test_turn_control_is_refused_for_continuous_models(lockstep, make_manager) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    handle.submit(cmd.AppendAudio(audio=frames(0.25)))
    handle.submit(cmd.Commit(event_id="c"))
    handle.submit(cmd.ResponseCreate(event_id="r"))
    handle.submit(cmd.BargeIn(event_id="b"))
    events = await take_ready(handle.attachment)
    assert [(e.code, e.related_event_id) for e in of_type(events, ev.ErrorEvent)] == [
        ("turn_control_unsupported", "c"),
        ("turn_control_unsupported", "r"),
        ("barge_in_unsupported", "b"),
    ]


async def test_an_engine_that_drops_the_session_still_completes_the_response_once(lockstep, make_manager) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    handle.submit(cmd.AppendAudio(audio=frames(1.5)))
    await settle()
    engine_session(lockstep, handle).end_stream()
    events = await asyncio.wait_for(read_to_end(handle.attachment), 5.0)
    assert len(of_type(events, ev.ResponseDone)) == 1
    assert isinstance(events[-1], ev.SessionClosed) and events[-1].reason == "engine_closed"
    assert manager.active_count() == 0


async def test_concurrent_and_replacement_sessions_never_share_a_response_id(lockstep, make_manager) -> None:
    manager = make_manager(lockstep, max_sessions=2)
    ids = set()
    first, second = await manager.open(), await manager.open()
    for handle in (first, second):
        handle.submit(cmd.AppendAudio(audio=frames(1)))
    await settle()
    await first.close()
    replacement = await manager.open()
    replacement.submit(cmd.AppendAudio(audio=frames(1)))
    await settle()
    for handle in (first, second, replacement):
        created = of_type(await take_ready(handle.attachment), ev.ResponseCreated)
        ids.add(created[0].response_id)
    assert len(ids) == 3


async def test_output_before_any_input_opens_the_response(lockstep, make_manager) -> None:
    manager = make_manager(lockstep)
    handle = await manager.open()
    engine_session(lockstep, handle).audio(None, samples=FRAME)  # the model greets first
    events = await take_ready(handle.attachment)
    assert names(events) == [
        "SessionCreated",
        "ResponseCreated",
        "ItemAdded",
        "OutputItemAdded",
        "ContentPartAdded",
        "AudioDelta",
    ]
