"""Fixtures for the session-core tests: a fake clock, the engine test double, managers
that are always shut down, and helpers to read what a session emitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import pytest

from rtserve.config import SessionLimits
from rtserve.sessions import SessionHandle, SessionManager
from rtserve.sessions.attachment import Attachment, _AttachmentState
from rtserve.sessions.buffer import OutputBuffer
from rtserve.sessions.events import SessionEvent
from tests.clocks import FakeClock
from tests.sessions.engine_double import TestDoubleEngine, TestDoubleEngineSession

# Real-time bounds only guard against a hung test; nothing asserts on timing.
HANG_GUARD_S = 10.0
E = TypeVar("E", bound=SessionEvent)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine() -> TestDoubleEngine:
    return TestDoubleEngine()


@pytest.fixture
async def make_manager(clock: FakeClock) -> AsyncIterator[Callable[..., SessionManager]]:
    managers: list[SessionManager] = []

    def make(engine: TestDoubleEngine, **limits: object) -> SessionManager:
        merged = {"engine_close_timeout_s": 0.5, **limits}
        manager = SessionManager(engine, SessionLimits.model_validate(merged), clock=clock)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        await manager.shutdown()


async def settle(rounds: int = 40) -> None:
    """Let every runner process what is queued (no wall-clock waiting)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def buffer_of(handle: SessionHandle) -> OutputBuffer:
    return handle._runner.outlet.buffer


def engine_session(engine: TestDoubleEngine, handle: SessionHandle) -> TestDoubleEngineSession:
    return engine.sessions[handle.session_id]


async def take_ready(attachment: Attachment) -> list[SessionEvent]:
    """Every event the attachment can deliver right now, after letting runners settle."""
    await settle()
    buffer = attachment._outlet.buffer
    out: list[SessionEvent] = []
    while (
        attachment._preamble
        or attachment._replay
        or buffer.pending_events
        or (buffer.closed and not buffer.finished and attachment.active)
        or attachment._state is _AttachmentState.SUPERSEDED
    ):
        delivery = await asyncio.wait_for(attachment.next_delivery(), HANG_GUARD_S)
        if delivery is None:
            break
        out.append(delivery.event)
    return out


async def read_until(attachment: Attachment, event_type: type, *, limit: int = 10_000) -> list[SessionEvent]:
    """Events up to and including the first ``event_type``."""
    out: list[SessionEvent] = []
    for _ in range(limit):
        delivery = await asyncio.wait_for(attachment.next_delivery(), HANG_GUARD_S)
        assert delivery is not None, f"stream ended before {event_type.__name__}: {names(out)}"
        out.append(delivery.event)
        if isinstance(delivery.event, event_type):
            return out
    raise AssertionError(f"no {event_type.__name__} in {limit} events")


async def read_to_end(attachment: Attachment) -> list[SessionEvent]:
    out: list[SessionEvent] = []
    while (delivery := await asyncio.wait_for(attachment.next_delivery(), HANG_GUARD_S)) is not None:
        out.append(delivery.event)
    return out


def names(events: list[SessionEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


def of_type(events: list[SessionEvent], event_type: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, event_type)]
