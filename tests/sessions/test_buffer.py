"""The bounded output buffer, exactly per docs/sessions.md#output-buffer."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest

from rtserve.sessions.buffer import BufferedEvent, OutputBuffer
from rtserve.sessions.errors import OutputOverflowError
from rtserve.sessions.events import (
    AudioDelta,
    ErrorEvent,
    ResponseCreated,
    ResponseDone,
    ResponseStatus,
    SessionClosed,
    SessionEvent,
    SessionExpired,
    TranscriptDelta,
)
from rtserve.sessions.projections import RealtimeProjection, compact_json
from tests.sessions.conftest import HANG_GUARD_S

SID = "duplex-test"
PROJECTION = RealtimeProjection("ga", duplex=True)


def make_buffer(**limits: int) -> OutputBuffer:
    merged = {"max_bytes": 1 << 20, "max_events": 512, **limits}
    return OutputBuffer(PROJECTION.render_text, **merged)


def audio(response_id: str = "old", epoch: int = 0, samples: int = 8) -> AudioDelta:
    return AudioDelta(
        session_id=SID,
        epoch=epoch,
        response_id=response_id,
        item_id=f"item_{response_id}",
        pcm=np.full(samples, 0.1, dtype=np.float32),
        sample_rate=24000,
    )


def done(response_id: str = "old", status: ResponseStatus = "completed") -> ResponseDone:
    return ResponseDone(session_id=SID, response_id=response_id, status=status)


def wire_bytes(event: SessionEvent) -> int:
    return len(compact_json(PROJECTION.render(event)).encode("utf-8"))


async def drain(buffer: OutputBuffer) -> list:
    out = []
    while (event := await asyncio.wait_for(buffer.get(), HANG_GUARD_S)) is not None:
        out.append(event)
    return out


def test_pending_bytes_are_the_compact_json_utf8_length_including_base64_audio() -> None:
    buffer = make_buffer()
    events = [
        audio(samples=100),
        TranscriptDelta(session_id=SID, response_id="r", item_id="i", delta="héllo ✓"),
        ResponseCreated(session_id=SID, response_id="r", modalities=("audio", "text")),
    ]
    for event in events:
        buffer.put(event)
    assert buffer.pending_events == 3
    assert buffer.pending_bytes == sum(wire_bytes(e) for e in events)
    # Non-ASCII text counts in UTF-8 bytes, not characters.
    text = compact_json(PROJECTION.render(events[1]))
    assert len(text.encode()) > len(text)


async def test_the_held_event_is_outside_the_budget_and_draining_empties_counters() -> None:
    buffer = make_buffer()
    buffer.put(audio())
    buffer.put(audio())
    first = await buffer.get()
    assert first is not None
    assert buffer.pending_events == 1
    assert buffer.pending_bytes == wire_bytes(first)
    await buffer.get()
    assert (buffer.pending_events, buffer.pending_bytes) == (0, 0)


async def test_cancel_removes_only_matching_audio_and_invalidates_held_audio() -> None:
    buffer = make_buffer()
    held = audio("old", 0)
    transcript = TranscriptDelta(session_id=SID, response_id="old", item_id="item_old", delta="x")
    other = audio("other", 0)
    newer = audio("old", 1)
    ending = done("old")
    for event in [held, dataclasses.replace(held), transcript, other, newer, ending]:
        buffer.put(event)
    assert await buffer.get() is held

    assert buffer.invalidate("old", through_epoch=0) == 1  # the queued copy
    assert buffer.pending_events == 4
    assert not buffer.is_valid(held)
    with buffer.guard(held) as valid:
        assert valid is False
    with buffer.guard(other) as valid:
        assert valid is True
    assert buffer.pending_bytes == sum(wire_bytes(e) for e in [transcript, other, newer, ending])
    buffer.close()
    assert await drain(buffer) == [transcript, other, newer, ending]


async def test_full_reserve_cannot_block_closure_or_reorder_valid_audio() -> None:
    buffer = make_buffer(max_events=1, reserve_events=1)
    first_audio, first_done = audio(), done()
    assert buffer.put(first_audio)
    assert buffer.put(first_done)  # from the reserve
    with pytest.raises(OutputOverflowError):
        buffer.put(done("again"))
    closed = SessionClosed(session_id=SID, reason="client_close")
    assert buffer.close(closed)  # independent slot
    assert not buffer.close(SessionClosed(session_id=SID, reason="duplicate"))
    assert buffer.put(audio()) is False  # late writes after closure are ignored
    got = [await buffer.get() for _ in range(4)]
    assert got == [first_audio, first_done, closed, None]


async def test_ordinary_events_cannot_use_the_reserve() -> None:
    buffer = make_buffer(max_events=2, reserve_events=4)
    buffer.put(audio())
    buffer.put(audio())
    with pytest.raises(OutputOverflowError):
        buffer.put(audio())
    buffer.put(ErrorEvent(session_id=SID, code="x", message="m"))  # errors may
    buffer.put(done())  # and response endings
    assert buffer.pending_events == 4


@pytest.mark.parametrize("closure_type", [SessionClosed, SessionExpired])
async def test_oversized_close_still_ends_stream_without_reopening_it(
    closure_type: type[SessionClosed | SessionExpired],
) -> None:
    buffer = make_buffer(max_bytes=128)
    closure = closure_type(session_id=SID, reason="client_close", details={"why": "x" * 5000})
    assert buffer.close(closure)
    delivered = await buffer.get()
    assert isinstance(delivered, closure_type) and type(delivered) is closure_type
    assert delivered.event_id == closure.event_id
    assert delivered.session_id == SID
    assert delivered.reason == "close_details_exceed_output_limit"
    assert delivered.details == {}
    assert wire_bytes(delivered) <= 4096
    assert await buffer.get() is None
    assert not buffer.close(SessionClosed(session_id=SID, reason="again"))
    assert await buffer.get() is None
    assert await buffer.get() is None


async def test_byte_limit_rejects_audio_without_changing_pending_budget() -> None:
    buffer = make_buffer(max_bytes=128)
    big = AudioDelta(
        session_id=SID, response_id="r", item_id="i", pcm=np.zeros(192, np.float32), sample_rate=24000
    )  # 256 base64 characters of PCM16
    with pytest.raises(OutputOverflowError):
        buffer.put(big)
    assert (buffer.pending_events, buffer.pending_bytes) == (0, 0)
    assert buffer.put(ErrorEvent(session_id=SID, code="x", message="fits the reserve"))


async def test_cancelled_waiter_can_be_replaced_and_woken_from_another_thread() -> None:
    buffer = make_buffer()
    first = asyncio.ensure_future(buffer.get())
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first

    waiter = asyncio.ensure_future(buffer.get())
    await asyncio.sleep(0)
    event = audio()
    threading.Thread(target=buffer.put, args=(event,)).start()
    assert await asyncio.wait_for(waiter, HANG_GUARD_S) is event

    waiter = asyncio.ensure_future(buffer.get())
    await asyncio.sleep(0)
    threading.Thread(target=buffer.close).start()
    assert await asyncio.wait_for(waiter, HANG_GUARD_S) is None


async def test_closure_is_delivered_after_everything_queued() -> None:
    buffer = make_buffer()
    events = [audio(), done()]
    for event in events:
        buffer.put(event)
    closure = SessionExpired(session_id=SID, reason="idle_ttl_expired")
    buffer.close(closure)
    assert await drain(buffer) == [*events, closure]
    assert buffer.finished


def test_closure_events_must_use_close() -> None:
    buffer = make_buffer()
    with pytest.raises(TypeError):
        buffer.put(SessionClosed(session_id=SID, reason="x"))
    with pytest.raises(TypeError):
        buffer.close(done())  # type: ignore[arg-type]  # deliberately not a closure: close() refuses it at run time


async def test_a_non_owner_consumer_is_interrupted_not_served() -> None:
    buffer = make_buffer()
    owner_a, owner_b = object(), object()
    buffer.claim(owner_a)
    waiting = asyncio.ensure_future(buffer.next_entry(owner_a))
    await asyncio.sleep(0)
    buffer.claim(owner_b)
    from rtserve.sessions.buffer import INTERRUPTED

    assert await asyncio.wait_for(waiting, HANG_GUARD_S) is INTERRUPTED
    event = audio()
    buffer.put(event)
    assert await buffer.next_entry(owner_a) is INTERRUPTED
    entry = await buffer.next_entry(owner_b)
    assert isinstance(entry, BufferedEvent) and entry.event is event
