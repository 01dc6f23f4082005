"""Detach, resume, takeover and replay (docs/sessions.md#resume, docs/sessions.md#journal)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rtserve.sessions import SessionConfig, SessionError
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.journal import JournalEntry, ReplayJournal
from rtserve.sessions.lease import Lease
from rtserve.sessions.projections import RealtimeProjection
from tests.clocks import FakeClock
from tests.sessions.conftest import names, read_to_end, settle, take_ready


async def heartbeats(handle, n: int) -> None:
    for _ in range(n):
        handle.submit(cmd.Heartbeat())
    await settle()


def resume(
    manager,
    handle,
    *,
    generation: int = 0,
    control_id: str = "ctl-1",
    last: int | None = None,
    token: str | None = None,
    **kwargs,
):
    return manager.resume(
        handle.session_id,
        resume_token=token or handle.resume_token,
        expected_generation=generation,
        control_id=control_id,
        last_received_seq=last,
        **kwargs,
    )


async def test_a_resume_replayed_under_its_control_id_reports_what_it_granted(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    old_token = handle.resume_token
    handle.attachment.detach()
    first = resume(manager, handle, token=old_token, control_id="ctl-A")
    again = resume(manager, handle, token=old_token, control_id="ctl-A")  # a retry after a lost answer
    assert again is first and first.generation == 1
    with pytest.raises(SessionError) as conflict:
        resume(manager, handle, token=old_token, control_id="ctl-B")  # stale generation, new caller
    assert conflict.value.code == "session_resume_conflict"
    [resumed, *_] = await take_ready(first)
    assert isinstance(resumed, ev.SessionResumed)
    assert resumed.attachment_generation == 1 and resumed.resume_token == handle.resume_token != old_token


async def test_resume_replays_what_the_client_missed_then_continues_live(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    await heartbeats(handle, 2)
    seen = await take_ready(handle.attachment)  # seq 1..3 delivered
    assert [e.server_event_seq for e in seen] == [1, 2, 3]
    await heartbeats(handle, 2)
    got = await handle.attachment.next_delivery()  # seq 4 sequenced, but the socket died before sending
    assert got.seq == 4
    assert handle.attachment.detach()
    await heartbeats(handle, 1)  # produced while detached: journaled by the parked drainer
    attachment = resume(manager, handle, last=3)
    await heartbeats(handle, 1)
    events = await take_ready(attachment)
    assert names(events) == ["SessionResumed", "HeartbeatAck", "HeartbeatAck", "HeartbeatAck", "HeartbeatAck"]
    assert isinstance(events[0], ev.SessionResumed)
    assert events[0].replayed == 3 and events[0].server_event_seq is None
    assert [e.server_event_seq for e in events[1:]] == [4, 5, 6, 7]  # no gap, no duplicate


async def test_takeover_replaces_the_old_attachment_without_losing_events(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    old = handle.attachment
    await heartbeats(handle, 3)
    delivered = [await old.next_delivery() for _ in range(2)]  # seq 1, 2
    new = resume(manager, handle, last=delivered[-1].seq)
    old_rest = await read_to_end(old)
    assert names(old_rest) == ["SessionReplaced"]
    assert isinstance(old_rest[0], ev.SessionReplaced) and old_rest[0].attachment_generation == 1
    assert not old.detach()  # a superseded socket cannot detach the session
    assert manager.detach(handle.session_id, 0) is False
    events = await take_ready(new)
    assert [e.server_event_seq for e in events[1:]] == [3, 4]
    await handle.close()
    assert names(await read_to_end(new)) == ["SessionClosed"]


async def test_a_detached_session_keeps_running_and_journals_beyond_its_output_buffer(engine, make_manager) -> None:
    manager = make_manager(engine, max_pending_output_events_per_session=4)
    handle = await manager.open()
    await take_ready(handle.attachment)
    handle.attachment.detach()
    for _ in range(10):  # far more than the buffer holds, over time
        await heartbeats(handle, 2)
    assert manager.get(handle.session_id) is not None  # not closed for backpressure
    attachment = resume(manager, handle, last=1)
    events = await take_ready(attachment)
    assert names(events) == ["SessionResumed"] + ["HeartbeatAck"] * 20


async def test_resume_past_the_journal_bound_asks_for_a_resync(engine, make_manager) -> None:
    manager = make_manager(engine, resume_replay_max_bytes_per_session=600)
    handle = await manager.open()
    await take_ready(handle.attachment)
    handle.attachment.detach()
    await heartbeats(handle, 20)
    attachment = resume(manager, handle, last=1)
    await heartbeats(handle, 1)
    events = await take_ready(attachment)
    assert names(events) == ["SessionResumed", "ResyncRequired", "HeartbeatAck"]
    assert isinstance(events[1], ev.ResyncRequired) and events[1].reason == "journal_overflow"
    assert events[2].server_event_seq == 22  # live delivery goes on


async def test_acknowledged_events_are_trimmed_from_the_journal(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    await heartbeats(handle, 3)
    await take_ready(handle.attachment)
    journal = handle._runner.outlet.journal
    assert len(journal) == 4
    handle.submit(cmd.EventAck(server_event_seq=3))
    assert len(journal) == 1
    handle.attachment.detach()
    events = await take_ready(resume(manager, handle, last=2))  # asks for what it acknowledged
    assert names(events) == ["SessionResumed", "ResyncRequired"]
    assert isinstance(events[1], ev.ResyncRequired) and events[1].reason == "journal_gap"


async def test_journal_entries_age_out_on_the_injected_clock(engine, make_manager, clock) -> None:
    manager = make_manager(engine, resume_replay_ttl_s=60.0)
    handle = await manager.open()
    await take_ready(handle.attachment)
    handle.attachment.detach()
    clock.advance(61.0)
    events = await take_ready(resume(manager, handle, last=0))
    assert names(events) == ["SessionResumed", "ResyncRequired"]


async def test_resume_refusals(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open()
    handle.attachment.detach()
    with pytest.raises(SessionError) as wrong_token:
        resume(manager, handle, token="not-the-token")
    assert wrong_token.value.code == "unknown_session"
    with pytest.raises(SessionError) as unknown:
        manager.resume("duplex-none", resume_token="x", expected_generation=0, control_id="c")
    assert unknown.value.code == "unknown_session"


async def test_a_session_opened_without_resume_closes_on_disconnect(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open(resumable=False)
    [created] = await take_ready(handle.attachment)
    assert isinstance(created, ev.SessionCreated)
    assert created.resume_token is None
    assert RealtimeProjection("ga").render(created)["session"]["capabilities"]["supports_session_resume"] is False
    with pytest.raises(SessionError) as refused:
        resume(manager, handle)
    assert refused.value.code == "unknown_session"  # like a missing id: no existence oracle
    assert handle.attachment.detach()
    await settle()
    assert manager.active_count() == 0
    assert handle._runner.terminal.reason == "disconnect"


async def test_replay_is_rendered_for_the_resuming_connection(engine, make_manager) -> None:
    manager = make_manager(engine)
    handle = await manager.open(SessionConfig(), projection=RealtimeProjection("ga", duplex=True))
    handle.submit(cmd.ResponseCreate())
    await settle()
    handle.attachment.detach()
    await settle()  # the parked drainer journals what the old connection never got
    attachment = resume(manager, handle, last=1, projection=RealtimeProjection("beta"))
    handle.submit(cmd.Heartbeat())
    texts: list[dict[str, Any]] = []
    while len(texts) < 6 and (delivery := await attachment.next_delivery()) is not None:
        texts.append(json.loads(delivery.text))
    assert [t["type"] for t in texts] == [
        "session.resumed",
        "response.created",
        "conversation.item.created",
        "response.output_item.added",
        "response.content_part.added",
        "session.heartbeat_ack",
    ]
    assert [t.get("server_event_seq") for t in texts] == [None, 2, 3, 4, 5, 6]
    assert "epoch" not in texts[1]  # the beta connection did not ask for duplex extensions


async def test_expired_detached_session_cannot_be_resumed(engine, make_manager, clock) -> None:
    manager = make_manager(engine, disconnect_grace_s=1.0)
    handle = await manager.open()
    handle.attachment.detach()
    clock.advance(2.0)
    assert await manager.reap_expired() == 1
    with pytest.raises(SessionError) as refused:
        resume(manager, handle)
    assert refused.value.code == "unknown_session"


async def test_clients_that_drop_connections_cannot_hold_every_slot(engine, make_manager, clock) -> None:
    manager = make_manager(engine, max_sessions=4, max_detached_sessions=2)
    dropped = []
    for _ in range(3):
        handle = await manager.open()
        handle.attachment.detach()
        dropped.append(handle)
        clock.advance(1.0)
    await settle()
    await manager.open()  # the longest-detached session gave its slot back
    await manager.open()
    with pytest.raises(SessionError) as refused:
        resume(manager, dropped[0])
    assert refused.value.code == "unknown_session"
    assert resume(manager, dropped[1]).generation == 1 and resume(manager, dropped[2], control_id="c2")
    assert manager.metrics.ended.labels("expired", "detached_limit")._value.get() == 1


# -- units ------------------------------------------------------------------------


def test_lease_detach_and_expiry_reasons() -> None:
    lease = Lease(now=0.0)
    assert lease.expiry_reason(1.0, idle_ttl_s=2.0, disconnect_grace_s=1.0) is None
    assert lease.expiry_reason(2.0, idle_ttl_s=2.0, disconnect_grace_s=1.0) == "idle_ttl_expired"
    assert lease.expiry_reason(1e9, idle_ttl_s=None, disconnect_grace_s=1.0) is None  # idle expiry disabled
    assert not lease.detach(expected_generation=1, now=0.0)
    assert lease.detach(expected_generation=0, now=0.5)
    assert lease.expiry_reason(1.4, idle_ttl_s=300.0, disconnect_grace_s=1.0) is None
    assert lease.expiry_reason(1.5, idle_ttl_s=300.0, disconnect_grace_s=1.0) == "disconnect_grace_expired"
    grant = lease.resume("c", 0, lease.resume_token, now=1.2)
    assert grant.generation == 1 and not lease.detached


def _entry(seq: int, size: int, at: float = 0.0) -> JournalEntry:
    return JournalEntry(seq, ev.HeartbeatAck(session_id="s"), "x" * size, size, at)


def _replayed(journal: ReplayJournal, last_seq: int) -> list[JournalEntry]:
    """What the journal replays after ``last_seq`` (a list: no resync reason)."""
    replayed = journal.replay_after(last_seq)
    assert isinstance(replayed, list), replayed
    return replayed


def test_journal_replay_and_gap_reasons() -> None:
    clock = FakeClock()
    journal = ReplayJournal(clock, max_bytes=30, ttl_s=10.0)
    for seq in range(1, 4):
        journal.append(_entry(seq, 10))
    assert [e.seq for e in _replayed(journal, 1)] == [2, 3]
    assert journal.replay_after(3) == []
    assert journal.replay_after(7) == "journal_gap"  # never sent
    journal.append(_entry(4, 10))  # evicts seq 1 by bytes
    assert journal.replay_after(0) == "journal_overflow"
    assert [e.seq for e in _replayed(journal, 1)] == [2, 3, 4]
    journal.ack(3)
    assert journal.replay_after(1) == "journal_gap"
    clock.advance(11.0)
    assert journal.replay_after(3) == "journal_gap" and journal.pending_bytes == 0
