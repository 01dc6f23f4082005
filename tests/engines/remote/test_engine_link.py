"""The engine link: audio of many sessions crosses in per-tick batches, tick-aligned, and
comes back whole and in order; the uplink's flush points sit just before the engine's ticks."""

from __future__ import annotations

import asyncio
import gc
import inspect
import socket
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import EngineLinkConfig, ServerConfig
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.events import EngineFailure, OutputAudio, OutputText
from rtserve.engines.remote.in_process import LinkedEngines
from rtserve.engines.remote.link import EngineLink, Uplink
from rtserve.engines.remote.server import EngineServer
from rtserve.engines.remote.wire import Kind, encode, pack_events, read_message, unpack_events
from rtserve.engines.values import SessionOptions

RATE = 24_000
FRAME = 1920  # 80 ms
CHUNK = 480  # 20 ms packets
SESSIONS = 8


def test_flush_points_sit_just_before_the_engines_ticks() -> None:
    uplink = Uplink(link=_SentMessages(), lead_s=0.015, last_calls_s=[0.008, 0.002])
    assert uplink._next_flush(5.0) == 5.0  # no tick seen yet: at once
    uplink.set_period(0.08)
    uplink.tick_output(10.0)
    assert uplink._next_flush(10.01) == pytest.approx(10.065)  # the main send before the next tick
    assert uplink._next_flush(10.066) == pytest.approx(10.072)  # after it: the first last call
    assert uplink._next_flush(10.073) == pytest.approx(10.078)  # after that: the second
    assert uplink._next_flush(10.079) == pytest.approx(10.145)  # too late for this tick: the next one's
    assert uplink._next_flush(10.5) == pytest.approx(10.545)  # ticks since the stamp keep the grid


async def test_many_sessions_cross_in_per_tick_batches_and_come_back_whole(config: ServerConfig) -> None:
    config = config.model_copy(
        update={
            "engine": "loopback",
            # The latency policies that drop input on purpose (after an underrun, or from a
            # standing backlog) are off: a loaded machine makes ticks late, and what this test
            # asks is that the link itself loses nothing.
            "lockstep": config.lockstep.model_copy(
                update={
                    "batch_size": SESSIONS,
                    "underrun_repay_ms": 0.0,
                    "latency_trim_window_frames": None,
                    "max_input_backlog_ms": 10_000.0,
                }
            ),
            "reference": config.reference.model_copy(update={"loopback_delay_frames": 1}),
        }
    )
    registry = CollectorRegistry()
    engines = LinkedEngines(EngineSet(config, registry), config)
    engines.start()
    try:
        for _ in range(200):
            if engines.ready:
                break
            await asyncio.sleep(0.01)
        sessions = [await engines.session_engine.open_session(f"s{i}", SessionOptions()) for i in range(SESSIONS)]
        rng = np.random.default_rng(7)
        sent = [rng.uniform(-0.5, 0.5, 40 * CHUNK).astype(np.float32) for _ in sessions]
        received: list[list[np.ndarray]] = [[] for _ in sessions]

        async def collect(i: int) -> None:
            async for event in sessions[i].events():
                if isinstance(event, OutputAudio):
                    received[i].append(event.pcm)

        collectors = [asyncio.create_task(collect(i)) for i in range(SESSIONS)]

        def messages(kind: str) -> float:
            return (
                registry.get_sample_value("rtserve_engine_link_messages_total", {"side": "worker", "kind": kind}) or 0.0
            )

        ticks_before = registry.get_sample_value("rtserve_lockstep_tick_seconds_count") or 0.0
        for k in range(40):  # every session sends a 20 ms packet every 20 ms, all at once
            for i, session in enumerate(sessions):
                session.push_audio(sent[i][k * CHUNK : (k + 1) * CHUNK])
            await asyncio.sleep(CHUNK / RATE)
        for session in sessions:
            await asyncio.wait_for(session.drain(), 5)
        ticks = (registry.get_sample_value("rtserve_lockstep_tick_seconds_count") or 0.0) - ticks_before
        # What waited when a tick's output came, one main send per tick, at most one late
        # top-up: never a message per session or packet.
        assert 0 < messages("frames_in") <= 3 * ticks + 3
        assert messages("frames_in") < 40 * SESSIONS / 4
        # Every sample comes back, in order. Tick-aligned framing may pad a tick whose packet
        # was still in flight with silence (the packet goes with the next tick), never lose one.
        assert (registry.get_sample_value("rtserve_lockstep_trimmed_input_samples_total") or 0.0) == 0
        for i in range(SESSIONS):
            echoed = np.concatenate(received[i])
            np.testing.assert_array_equal(echoed[echoed != 0], sent[i])
        for session in sessions:
            await session.close()
        for task in collectors:
            await asyncio.wait_for(task, 5)
    finally:
        await engines.stop()


class _SentMessages:
    """An uplink's link (``MessageSink``) that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)


async def test_audio_waiting_when_a_ticks_output_arrives_goes_before_the_sessions_get_it() -> None:
    """Handing a tick's output to a worker's sessions keeps its loop busy; a flush point inside
    that work would send late. What is pending when the output arrives goes at once."""
    link = _SentMessages()
    uplink = Uplink(link=link, lead_s=0.015, last_calls_s=[0.002])
    uplink.set_period(0.08)
    loop = asyncio.get_running_loop()
    uplink.tick_output(loop.time() - 0.01)  # the next tick in 70 ms: its main flush in 55
    uplink.push(1, np.zeros(CHUNK, np.float32))
    uplink.push(2, np.ones(CHUNK, np.float32))
    assert link.sent == []  # waits for its flush point
    uplink.tick_output(loop.time() - 0.01)  # a tick's output arrives first
    assert len(link.sent) == 1
    kind, batch = link.sent[0]
    assert kind is Kind.FRAMES_IN and sorted(handle for handle, _ in batch) == [1, 2]
    uplink.tick_output(loop.time() - 0.01)  # nothing waiting: no message
    assert len(link.sent) == 1
    uplink.push(1, np.zeros(CHUNK, np.float32))  # later audio keeps its flush point
    assert len(link.sent) == 1
    await asyncio.sleep(0.1)
    assert len(link.sent) == 2


async def test_a_ticks_output_goes_to_the_sessions_whose_stepped_audio_waited_longest_first() -> None:
    """One tick's frames reach a worker together; the session whose stepped input arrived just
    after the previous tick has waited a period already and is served first, even when it has
    sent newer audio since (for the next tick, or a page that missed this one)."""
    uplink = Uplink(link=_SentMessages(), lead_s=0.015, last_calls_s=[0.002])
    for handle in (1, 2, 3):
        uplink.time_arrivals(handle)  # lockstep sessions (4 is not)
    for handle in (3, 1, 2):  # arrival order: 3, then 1, then 2 (a new loop time each)
        uplink.push(handle, np.zeros(CHUNK, np.float32))
        await asyncio.sleep(0.002)
    uplink.push(3, np.zeros(CHUNK, np.float32))  # 3's next audio, newest of all: not stepped yet
    uplink.push(4, np.zeros(CHUNK, np.float32))  # not timed: no log, served after the timed ones

    def frame(stepped: int) -> OutputAudio:
        return OutputAudio(pcm=np.zeros(FRAME, np.float32), epoch=0, input_samples=stepped)

    text = OutputText(text="t", epoch=0)
    events: list[tuple[int, Any]] = [(1, frame(CHUNK)), (4, frame(CHUNK)), (2, frame(CHUNK))]
    events += [(3, frame(CHUNK)), (1, text)]
    assert [h for h, _ in uplink.in_delivery_order(events)] == [3, 1, 1, 2, 4]
    # Next tick: 1 stepped nothing new (no input of its own to wait for), 3 its second push.
    events = [(1, frame(CHUNK)), (3, frame(2 * CHUNK))]
    assert [h for h, _ in uplink.in_delivery_order(events)] == [3, 1]
    uplink.drop(3)  # a closed session is forgotten
    uplink.push(2, np.zeros(CHUNK, np.float32))
    assert [h for h, _ in uplink.in_delivery_order([(3, frame(3 * CHUNK)), (2, frame(2 * CHUNK))])] == [2, 3]


async def test_audio_cleared_before_it_was_sent_does_not_make_later_frames_read_older() -> None:
    """Clearing a session's input drops its audio not yet sent; the engine never counts that
    audio, so the session's later frames must be timed by the audio sent after the clear."""
    link = _SentMessages()
    uplink = Uplink(link=link, lead_s=0.015, last_calls_s=[0.002])
    uplink.set_period(0.08)
    uplink.tick_output(asyncio.get_running_loop().time() - 0.01)  # no flush point for 55 ms
    for handle in (1, 2):
        uplink.time_arrivals(handle)
    uplink.push(1, np.zeros(CHUNK, np.float32))
    uplink.flush()  # the engine has it
    await asyncio.sleep(0.002)
    uplink.push(1, np.ones(CHUNK, np.float32))  # cleared below, before any flush
    await asyncio.sleep(0.002)
    uplink.push(2, np.zeros(CHUNK, np.float32))
    await asyncio.sleep(0.002)
    uplink.drop_pending(1)
    uplink.push(1, np.full(CHUNK, 0.5, np.float32))  # after 2's audio
    uplink.flush()
    sent = {handle: pcm for handle, pcm in link.sent[-1][1]}
    assert sorted(sent) == [1, 2] and float(sent[1][0]) == 0.5 and len(sent[1]) == CHUNK

    def frame(stepped: int) -> OutputAudio:
        return OutputAudio(pcm=np.zeros(FRAME, np.float32), epoch=0, input_samples=stepped)

    # 1's frame stepped its first audio and the audio after the clear: newer than 2's.
    assert [h for h, _ in uplink.in_delivery_order([(1, frame(2 * CHUNK)), (2, frame(CHUNK))])] == [2, 1]


async def test_audio_crossing_the_link_leaves_nothing_for_the_garbage_collector() -> None:
    """Realtime sessions keep a minute of received audio for resumes; every object it drags along
    that the collector tracks lengthens every full collection, which stalls all sessions of a worker."""
    reader = asyncio.StreamReader()
    sent = [
        (1, OutputAudio(pcm=np.ones(FRAME, np.float32), epoch=0)),
        (2, OutputAudio(pcm=np.zeros(FRAME, np.float32), epoch=0)),
    ]
    reader.feed_data(encode((Kind.EVENTS_OUT, *pack_events(sent), 2.0)))
    reader.feed_eof()
    message = await read_message(reader)
    assert message is not None
    pcm = unpack_events(message[1], message[2])[0][1].pcm
    np.testing.assert_array_equal(pcm, np.ones(FRAME, np.float32))
    held = pcm
    while isinstance(held, np.ndarray):
        held = held.base
    assert held is None or not gc.is_tracked(held)


async def test_a_ticks_events_cross_the_link_as_they_were_sent() -> None:
    """A worker's batch packs its audio frames into one buffer; every event comes out with every
    field, in order, among the events that are not audio (text, a failure, a session's end)."""
    sent: list[tuple[int, Any]] = [
        (1, OutputAudio(pcm=np.full(FRAME, 0.5, np.float32), epoch=2, text=" hi", tick_due=7.0, input_samples=1920)),
        (2, OutputText(text="x", epoch=0)),
        (1, OutputAudio(pcm=np.zeros(0, np.float32), epoch=2)),
        (3, OutputAudio(pcm=np.arange(5, dtype=np.float32), epoch=0, response_id="r1")),
        (3, EngineFailure("engine_error", "failed")),
        (3, None),
    ]
    reader = asyncio.StreamReader()
    reader.feed_data(encode((Kind.EVENTS_OUT, *pack_events(sent), 7.0)))
    reader.feed_eof()
    message = await read_message(reader)
    assert message is not None and message[3] == 7.0
    received = unpack_events(message[1], message[2])
    assert [h for h, _ in received] == [h for h, _ in sent]
    for (_, got), (_, want) in zip(received, sent, strict=True):
        if isinstance(want, OutputAudio):
            assert isinstance(got, OutputAudio)
            np.testing.assert_array_equal(got.pcm, want.pcm)
            assert replace(got, pcm=want.pcm) == want
        else:
            assert got == want


class _NullWriter:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("per_turn", "read_after"), [(1, 1), (None, 6)])
async def test_a_ticks_frames_reach_the_sessions_one_loop_turn_apart(per_turn: int | None, read_after: int) -> None:
    """Each session encodes and writes its frame when it gets it; with ``serve_frames_per_turn``
    the loop runs what came due meanwhile (a client's page read, the uplink's last call) between
    sessions, where all at once it waited for the whole worker's share."""
    reader = asyncio.StreamReader()

    async def connect() -> tuple[asyncio.StreamReader, _NullWriter]:
        return reader, _NullWriter()

    link = EngineLink(connect, 0, settings=EngineLinkConfig(serve_frames_per_turn=per_turn))
    served: list[str] = []
    loop = asyncio.get_running_loop()

    def sink(event: Any) -> None:
        if not served:  # a page arrives while the first session is served
            loop.call_soon(served.append, "read")
        served.append("frame")

    for handle in range(1, 7):
        link.register_session(handle, sink)
    frames = [(h, OutputAudio(pcm=np.zeros(FRAME, np.float32), epoch=0, tick_due=1.0)) for h in range(1, 7)]
    reader.feed_data(encode((Kind.EVENTS_OUT, *pack_events(frames), 1.0)))
    link.start()
    for _ in range(200):
        if len(served) == 7:
            break
        await asyncio.sleep(0.005)
    order = list(served)
    await link.close()  # (which tells every session the engine is gone)
    assert order.index("read") == read_after and order.count("frame") == 6


def test_a_frames_tick_stamp_is_put_on_the_workers_clock() -> None:
    """An engine on another host stamps its ticks on its own monotonic clock; the front end's
    server-path parts subtract its push times from them, so the link shifts them by the offset."""
    sent = [(1, OutputAudio(pcm=np.zeros(FRAME, np.float32), epoch=0, tick_due=107.5)), (2, None)]
    received = unpack_events(*pack_events(sent), clock_offset_s=100.0)
    audio = received[0][1]
    assert isinstance(audio, OutputAudio) and audio.tick_due == 7.5
    assert received[1] == (2, None)


def _connection_handlers() -> list[tuple[asyncio.Task[Any], Coroutine[Any, Any, Any]]]:
    name = "EngineServer.serve_connection"
    tasks = [(t, t.get_coro()) for t in asyncio.all_tasks()]
    return [(t, coro) for t, coro in tasks if isinstance(coro, Coroutine) and getattr(coro, "__qualname__", "") == name]


async def test_an_engine_server_closing_as_workers_connect_leaves_no_handler_running(
    config: ServerConfig, tmp_path: Path
) -> None:
    """Workers connect as the engine process starts; when its engine fails to load it closes the
    server at once. A connection accepted just then, whose handler has not run yet, is closed too:
    a handler left reading is cancelled at the loop's end, which asyncio 3.11 logs as a traceback
    where the user should see one line naming the config error."""
    server = EngineServer(EngineSet(config.model_copy(update={"engine": "loopback"}), CollectorRegistry()))
    path = str(tmp_path / "engine.sock")
    await server.serve_unix(path)
    workers = [socket.socket(socket.AF_UNIX) for _ in range(4)]
    try:
        for worker in workers:
            worker.connect(path)
        for _ in range(1000):  # until a connection is accepted and its handler waits for its first step
            if any(inspect.getcoroutinestate(coro) == inspect.CORO_CREATED for _, coro in _connection_handlers()):
                break
            await asyncio.sleep(0)
        else:
            pytest.fail("no connection was accepted")
        await server.close()
        assert [t for t, _ in _connection_handlers() if not t.done()] == []
    finally:
        for worker in workers:
            worker.close()
