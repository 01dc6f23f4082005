"""A worker's connection to the engine process: calls, streams and the per-tick data path.

``EngineLink`` keeps one stream open and reconnects when the engine process restarts.
While it is down, calls fail at once with ``engine_unavailable`` and every live engine
session ends with ``engine_failure``; the offer says not ready, so ``/health`` is 503.

Audio pushed by sessions waits in ``Uplink`` and crosses as one ``FRAMES_IN`` per tick,
flushed ``uplink_lead_ms`` before the engine's next tick, plus last-call top-ups for audio
that arrived after that (the engine reports when its ticks are due on its drift-free
schedule, so a tick that started late does not shift the flush points; both processes read
the same monotonic clock). Engines without ticks get one message per event-loop turn.
A tick's output reaches the sessions ``serve_frames_per_turn`` at a time (``_serve_tick``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from rtserve.config import EngineLinkConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure, OutputAudio
from rtserve.engines.input_arrivals import InputArrivals
from rtserve.engines.remote.offer import EngineOffer
from rtserve.engines.remote.wire import Kind, LinkMetrics, RemoteError, read_message, unpack_events, write
from rtserve.errors import ENGINE_PROCESS_LOST, ENGINE_UNAVAILABLE

log = logging.getLogger(__name__)

_RECONNECT_S = 0.2


class EngineUnavailable(EngineError):
    code = ENGINE_UNAVAILABLE


_DEFAULTS = EngineLinkConfig()  # a link made without the server's settings (tests, benchmarks)


class EngineLink:
    def __init__(
        self,
        connect: Callable[[], Any],
        worker_index: int,
        *,
        settings: EngineLinkConfig = _DEFAULTS,
        metrics: LinkMetrics | None = None,
    ) -> None:
        self._connect = connect  # () -> awaitable (reader, writer)
        self.worker_index = worker_index
        self.offer: EngineOffer | None = None
        self.connected = asyncio.Event()
        self.uplink = Uplink(self, settings.uplink_lead_ms / 1000, [ms / 1000 for ms in settings.uplink_last_call_ms])
        self._serve_turn = settings.serve_frames_per_turn
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[Any]] = {}
        self._sessions: dict[int, Callable[[Any], None]] = {}  # handle -> event sink
        # Events can arrive for a session opened a moment ago before its opener has run and
        # registered it (the engine numbers sessions upwards per connection): held until then.
        self._early: dict[int, list[Any]] = {}
        self._newest_handle = 0
        self._offer_listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._metrics = metrics
        # The engine's monotonic clock minus this process's: 0 on one host; a connect() to an
        # engine on another host measures it (cluster/auth.py) so tick stamps mean our time.
        self.clock_offset_s = 0.0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._lost()

    def on_offer(self, listener: Callable[[], None]) -> None:
        self._offer_listeners.append(listener)

    async def _run(self) -> None:
        while not self._closing:
            try:
                reader, writer = await self._connect()
            except OSError:
                await asyncio.sleep(_RECONNECT_S)
                continue
            self._writer = writer
            self.send((Kind.HELLO, self.worker_index))
            try:
                await self._read(reader)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                log.warning("engine link broke: %s", exc)
            finally:
                with contextlib.suppress(Exception):
                    writer.close()
                self._lost()
            if not self._closing:
                log.warning("engine process gone; reconnecting")
                await asyncio.sleep(_RECONNECT_S)

    def _lost(self) -> None:
        """The engine is gone: fail everything that waited on it."""
        self._writer = None
        self.connected.clear()
        if self.offer is not None and self.offer.ready:
            self.offer = _not_ready(self.offer, "the engine process stopped")
            self._notify_offer()
        error = EngineUnavailable("the engine process is not reachable")
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        for queue in self._streams.values():
            queue.put_nowait(_StreamEnd(RemoteError(str(error), code=error.code)))
        self._streams.clear()
        sinks, self._sessions = self._sessions, {}
        for sink in sinks.values():
            sink(_ENGINE_LOST)
        self._early.clear()
        self._newest_handle = 0  # a new connection numbers its sessions from 1 again
        self.uplink.clear()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while (message := await read_message(reader)) is not None:
            kind = message[0]
            if kind is Kind.EVENTS_OUT:
                events, tick_due = unpack_events(message[1], message[2], self.clock_offset_s), message[3]
                if tick_due is None:
                    self._deliver(events)
                else:  # a lockstep tick's frames
                    events = self.uplink.in_delivery_order(events)
                    self.uplink.tick_output(tick_due - self.clock_offset_s)
                    await self._serve_tick(events)
            elif kind is Kind.RESULT:
                future = self._calls.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_result(message[2])
            elif kind is Kind.ERROR:
                future = self._calls.pop(message[1], None)
                if future is not None and not future.done():
                    future.set_exception(message[2].unwrap())
            elif kind is Kind.STREAM_ITEM:
                queue = self._streams.get(message[1])
                if queue is not None:
                    queue.put_nowait(message[2])
            elif kind is Kind.STREAM_END:
                queue = self._streams.pop(message[1], None)
                if queue is not None:
                    queue.put_nowait(_StreamEnd(message[2]))
            elif kind is Kind.STATUS:
                self.offer = message[1]
                self.connected.set()
                self._notify_offer()

    def _deliver(self, events: list[tuple[int, Any]]) -> None:
        for handle, event in events:
            sink = self._sessions.get(handle)
            if sink is not None:
                sink(event)
                if event is None:
                    del self._sessions[handle]
            elif handle > self._newest_handle:
                self._early.setdefault(handle, []).append(event)

    async def _serve_tick(self, events: list[tuple[int, Any]]) -> None:
        """A tick's frames, ``serve_frames_per_turn`` sessions' at a time, one event-loop turn each.

        A frame handed over wakes its session, which encodes and writes it in the loop's next turn.
        Handed all at once, a worker's few dozen sessions take one turn of 15-30 ms in which no
        socket is read and no timer runs: with a tick that ends ~60 ms into its period, audio sent
        in the last ~18 ms before the next tick is read too late for the uplink's last calls and
        waits a tick more (docs/engines.md#scaling)."""
        turn = self._serve_turn or max(1, len(events))  # range() refuses a step of 0
        for start in range(0, len(events), turn):
            if start:
                await asyncio.sleep(0)  # the loop reads the sockets and runs due timers between turns
            self._deliver(events[start : start + turn])

    def _notify_offer(self) -> None:
        for listener in self._offer_listeners:
            listener()

    # ------------------------------------------------------------------ sending

    def send(self, message: tuple[Any, ...]) -> None:
        if self._writer is None:
            raise EngineUnavailable("the engine process is not reachable")
        write(self._writer, message, self._metrics, "worker")

    async def call(self, target: str, method: str, *args: Any) -> Any:
        """A control call with a reply; engine errors are raised here with their code."""
        self.uplink.flush()  # audio pushed before a control call is applied before it
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.send((Kind.CALL, call_id, target, method, args))
        self._calls[call_id] = future
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def call_opening(self, close: Callable[[Any], None], target: str, method: str, *args: Any) -> Any:
        """A call that opens something in the engine process (a session, a stream). A caller that
        gives up meanwhile (its client left mid-open) gets it closed by ``close(result)`` once open."""
        opening = asyncio.ensure_future(self.call(target, method, *args))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(lambda done: _close_unwanted(done, close))
            raise

    def command(self, target: str, method: str, *args: Any) -> None:
        """A one-way control call (no reply), ordered after the audio pushed so far."""
        self.uplink.flush()
        with contextlib.suppress(EngineUnavailable):  # the session is failing anyway
            self.send((Kind.CALL, None, target, method, args))

    def register_session(self, handle: int, sink: Callable[[Any], None]) -> None:
        self._newest_handle = max(self._newest_handle, handle)
        early = self._early.pop(handle, [])
        # Older handles never registered (their opener gave up): their events go nowhere.
        self._early = {h: held for h, held in self._early.items() if h > self._newest_handle}
        if early and early[-1] is None:  # it already ended
            early.pop()
            for event in early:
                sink(event)
            sink(None)
            return
        self._sessions[handle] = sink
        for event in early:
            sink(event)

    async def stream(
        self, target: str, method: str, *args: Any, input_items: AsyncIterator[Any] | None = None
    ) -> AsyncGenerator[Any, None]:
        """Items of an engine-side async iterator; closing this one cancels that one."""
        stream_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.send((Kind.STREAM_OPEN, stream_id, target, method, args, input_items is not None))
        self._streams[stream_id] = queue
        feeder = asyncio.create_task(self._feed(stream_id, input_items)) if input_items is not None else None
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _StreamEnd):
                    finished = True
                    if item.error is not None:
                        raise item.error.unwrap()
                    return
                self.send((Kind.STREAM_CREDIT, stream_id, 1))
                yield item
        finally:
            if feeder is not None:
                feeder.cancel()
            if not finished and self._streams.pop(stream_id, None) is not None:
                with contextlib.suppress(EngineUnavailable):
                    self.send((Kind.STREAM_CANCEL, stream_id))

    async def _feed(self, stream_id: int, items: AsyncIterator[Any]) -> None:
        async for item in items:
            self.send((Kind.STREAM_INPUT, stream_id, item))
        self.send((Kind.STREAM_INPUT, stream_id, None))


class MessageSink(Protocol):
    """What the uplink needs of its link: somewhere to send one message (``EngineLink.send``)."""

    def send(self, message: tuple[Any, ...]) -> None: ...


class Uplink:
    """Audio of every session of this worker, sent as one message per engine tick.

    The main flush goes ``lead_s`` before the engine's next tick, with margin for a busy
    loop on either side; audio that arrives after it still catches the tick in small
    last-call messages, ``last_calls_s`` before it. What waits when a tick's output arrives
    goes at once (``tick_output``), before the loop is busy handing that output to the
    sessions. At most two messages a tick and one per last call.

    Two last calls rather than one: a top-up 2 ms before the tick missed it about one time in
    ten on a 2-core machine (the sending loop late, the engine process's loop busy), and every
    page that arrived since the main send, a third of a period's, then waited a whole tick more
    or was stepped as silence. One 8 ms before takes most of them in time; the one at 2 ms only
    what came after (benchmarks/notes/moshi_speed.md, "Twenty-second session").

    It also remembers when each session's audio arrived, so a tick's output can be handed to
    the sessions oldest stepped input first (``in_delivery_order``).
    """

    def __init__(self, link: MessageSink, lead_s: float, last_calls_s: Sequence[float]) -> None:
        self._link = link
        self._leads = sorted({lead_s, *last_calls_s}, reverse=True)
        self._pending: list[tuple[int, Any]] = []
        self._arrivals: dict[int, InputArrivals] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick_origin: float | None = None
        self._period_s: float | None = None

    def set_period(self, period_s: float | None) -> None:
        self._period_s = period_s

    def tick_output(self, tick_due: float) -> None:
        """The output of the engine's tick that was due at ``tick_due`` arrived (the grid the
        flush points sit on).

        The audio waiting now is for the next tick and is sent at once. Handing the output to
        this worker's sessions (encoding and sending each one's frame) keeps the loop busy for a
        while, and a flush point falling inside that work would go only after it, late for the
        tick. Sending earlier does not cure that alone: with the 7B Moshi step at ~59 ms a 15 ms
        lead's flush point still fell inside the serving and ~1.2 % of the input was trimmed,
        hence the 30 ms default lead (benchmarks/notes/moshi_speed.md, "Fifteenth session")."""
        self._tick_origin = tick_due
        self.flush()

    def push(self, handle: int, pcm: Any) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._pending.append((handle, pcm))
        arrivals = self._arrivals.get(handle)
        if arrivals is not None:
            arrivals.push(len(pcm), now)
        if self._timer is None:
            self._timer = loop.call_at(self._next_flush(now), self.flush)

    def time_arrivals(self, handle: int) -> None:
        """Log when the session's audio arrives, to order its frames (``in_delivery_order``): for
        lockstep sessions only, whose frames say what input they stepped. Others (a speech-to-text
        stream, a cascade) never answer it, and their log would only fill up to its bound."""
        self._arrivals[handle] = InputArrivals()

    def in_delivery_order(self, events: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """A tick's ``(handle, event)`` pairs, the sessions whose newest stepped audio arrived
        earliest first (sessions without audio last; each session's own events keep their order).

        Every frame of a tick reaches this worker at once and the loop serves the sessions one
        after another, tens of milliseconds apart with dozens of sessions. Audio that arrived
        just after the previous tick has already waited a whole period, audio that arrived just
        before this one almost nothing: serving them in that order keeps wait plus service time
        near one period for every session, instead of adding the whole burst to the unluckiest.

        The time is that of the audio the frame stepped (its ``input_samples``), not of the newest
        sent: by the time a 60 ms tick's output arrives most sessions have sent the next tick's
        audio, and a page that missed its tick is the newest while its session waited longest."""
        arrived: dict[int, float] = {}
        for handle, event in events:
            if handle not in arrived and isinstance(event, OutputAudio) and event.input_samples is not None:
                arrivals = self._arrivals.get(handle)
                at = None if arrivals is None else arrivals.arrival_of(event.input_samples)
                if at is not None:
                    arrived[handle] = at
        return sorted(events, key=lambda item: arrived.get(item[0], math.inf))

    def _next_flush(self, now: float) -> float:
        """The next flush point before one of the engine's ticks; now when the engine has no ticks."""
        origin, period = self._tick_origin, self._period_s
        if origin is None or period is None:
            return now
        # loop.time() is time.monotonic() (asyncio's default clock), as the engine's stamp is.
        next_tick = origin + ((now - origin) // period + 1) * period
        for tick in (next_tick, next_tick + period):
            for lead in self._leads:
                if tick - lead > now:
                    return tick - lead
        return now

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        with contextlib.suppress(EngineUnavailable):  # sessions fail with engine_failure meanwhile
            self._link.send((Kind.FRAMES_IN, _joined_per_session(batch)))

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
        self._arrivals.clear()

    def drop_pending(self, handle: int) -> None:
        """The session's audio not sent yet goes (its input was cleared); its arrival log forgets
        it, as the engine never counts it."""
        dropped = sum(len(pcm) for h, pcm in self._pending if h == handle)
        self._pending = [(h, pcm) for h, pcm in self._pending if h != handle]
        arrivals = self._arrivals.get(handle)
        if arrivals is not None and dropped:
            arrivals.take_back(dropped)

    def drop(self, handle: int) -> None:
        """The session closed: its pending audio and its arrivals go."""
        self.drop_pending(handle)
        self._arrivals.pop(handle, None)


def _joined_per_session(batch: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """One chunk per session (in push order): the engine process then does one push per
    session per tick, not one per packet."""
    chunks: dict[int, list[Any]] = {}
    for handle, pcm in batch:
        chunks.setdefault(handle, []).append(pcm)
    return [(handle, parts[0] if len(parts) == 1 else np.concatenate(parts)) for handle, parts in chunks.items()]


def _close_unwanted(opening: asyncio.Future[Any], close: Callable[[Any], None]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        close(opening.result())


class _StreamEnd:
    def __init__(self, error: RemoteError | None) -> None:
        self.error = error


_ENGINE_LOST = object()  # sentinel event: the link to the engine broke
ENGINE_LOST_FAILURE = EngineFailure(ENGINE_PROCESS_LOST, "the engine process stopped")  # what a session sees of it


def engine_lost(event: Any) -> bool:
    return event is _ENGINE_LOST


def _not_ready(offer: EngineOffer, failure: str) -> EngineOffer:
    return replace(offer, ready=False, failure=failure)
