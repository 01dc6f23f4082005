"""The engine process's side of the engine-client seam: serves every worker's link.

Each connected worker gets a ``WorkerLink``. Engine sessions it opens live here; their
output events are collected per link and sent as ONE ``EVENTS_OUT`` message per event-loop
turn. The lockstep scheduler wakes this loop once per tick, and lockstep sessions forward
their frames (``ForwardsEvents``) inside that one wake-up, so for lockstep engines that is
one message per worker per tick, sent without first waking a task per session (other
sessions are pumped by a task each). Audio arrives the same way, one ``FRAMES_IN`` per
worker per tick, and is pushed into the sessions in order with the control calls.
Streams on the streaming speech-to-text engine (``speech_stream_host.py``) are handles on the
same path, and ``/api/tts_streaming`` streams are turn-engine streams (``tts_stream_host.py``):
one STT and one TTS engine serve every worker.

Every session opened or closed re-sends the offer (with the engine's session count) to
every link, the opener's before its open call's answer: front-ends choosing among several
engines (``cluster/``) see each engine's load. A draining engine opens no new sessions.

A link that stops reading (its worker is stuck or gone) is dropped once its send buffer
passes ``max_send_buffer_bytes``: its sessions close, no other worker is affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from prometheus_client import generate_latest

from rtserve.engines.engine_set import EngineSet
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import OutputAudio
from rtserve.engines.kyutai_stt.service import SpeechStream, SpeechStreamEngine
from rtserve.engines.kyutai_tts.service import TTSStreamEngine
from rtserve.engines.policy.errors import PolicyInferenceError
from rtserve.engines.protocols import CountsTokens, EngineSession, ForwardsEvents, token_counter
from rtserve.engines.remote.offer import EngineOffer, offer_of
from rtserve.engines.remote.speech_stream_host import HostedSpeechStreams
from rtserve.engines.remote.tts_stream_host import speak
from rtserve.engines.remote.wire import Kind, LinkMetrics, RemoteError, pack_events, read_message, write
from rtserve.errors import CANCELLED, ENGINE_ERROR, ENGINE_UNAVAILABLE, MODEL_NOT_FOUND, POLICY_UNAVAILABLE
from rtserve.process_metrics import merge_expositions

log = logging.getLogger(__name__)

_STREAM_WINDOW = 16  # items a stream may run ahead of its consumer (credit-based)
_HANDLER_EXIT_S = 2.0  # on close, how long the links' handlers get to return


class EngineServer:
    def __init__(self, engines: EngineSet, *, max_send_buffer_bytes: int = 64 * 1024 * 1024) -> None:
        self.engines = engines
        self.max_send_buffer_bytes = max_send_buffer_bytes
        self.links: set[WorkerLink] = set()
        self._handlers: set[asyncio.Task[None]] = set()  # serve_connection of each link
        self._closing = False
        self.metrics = LinkMetrics(engines.registry)
        self._server: asyncio.AbstractServer | None = None
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        engines.on_change(self.broadcast_status)

    async def serve_unix(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # left by an engine process that was killed
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._accept, path)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The handler is our own task, known from the moment the connection is accepted: close()
        # waits for every one. (Handed a coroutine instead, asyncio 3.11's stream server runs it in
        # a task of its own and logs that task's cancellation at loop end as an error.)
        handler = asyncio.get_running_loop().create_task(self.serve_connection(reader, writer))
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)

    def offer(self) -> EngineOffer:
        return replace(offer_of(self.engines), sessions=self.session_count(), draining=self.draining)

    def session_count(self) -> int:
        return sum(link.session_count for link in self.links)

    def broadcast_status(self) -> None:
        """Tell every worker what the engine offers now (ready, failure, models, load)."""
        offer = self.offer()
        for link in list(self.links):
            link.send((Kind.STATUS, offer))

    def sessions_changed(self) -> None:
        if self.session_count() == 0:
            self._idle.set()
        else:
            self._idle.clear()
        self.broadcast_status()

    def drain(self) -> None:
        """Open no new sessions (front-ends see ``draining`` and go elsewhere); live ones go on."""
        self.draining = True
        self.broadcast_status()

    async def wait_idle(self) -> None:
        """Until no session is open on this engine."""
        await self._idle.wait()

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(link.close() for link in list(self.links)), return_exceptions=True)
        # Let each handler see its closed link (or, accepted but not yet running, the closing
        # server) and return, so none is left for the loop's end to cancel.
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=_HANDLER_EXIT_S)

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.close()
            return
        link = WorkerLink(self, reader, writer)
        self.links.add(link)
        handler = asyncio.current_task()  # also reached from other servers' handlers (cluster, in-process)
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        try:
            await link.run()
        except (ConnectionError, asyncio.IncompleteReadError) as exc:  # the worker died mid-message
            log.warning("worker %d link broke: %s", link.worker_index, exc)
        finally:
            self.links.discard(link)
            await link.close()
            self.sessions_changed()


class WorkerLink:
    """One worker's connection: its sessions, streams and calls."""

    def __init__(self, server: EngineServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._server = server
        self._engines = server.engines
        self._reader = reader
        self._writer = writer
        self.worker_index = -1
        self.metrics_text = b""
        self._sessions: dict[int, EngineSession] = {}
        self._releasing = 0  # sessions closing: their slots are not free yet
        self._pumps: dict[int, asyncio.Task[None]] = {}
        self._handles = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._streams: dict[int, _HostedStream] = {}
        self._speech = HostedSpeechStreams(self._queue_event)  # streaming STT streams, handles shared with sessions
        self._events: list[tuple[int, Any]] = []
        self._closed = False
        self._calls: dict[tuple[str, str], Callable[..., Any]] = {
            ("engine", "open_session"): self._open_session,
            ("session", "commit_input"): self._session_call("commit_input"),
            ("session", "drain"): self._session_call("drain"),
            ("session", "close"): self._close_session,
            ("session", "clear_input"): self._session_call("clear_input"),
            ("session", "set_epoch"): self._session_call("set_epoch"),
            ("session", "respond"): self._session_call("respond"),
            ("session", "configure_turn_detection"): self._session_call("configure_turn_detection"),
            ("stt", "open_stream"): self._open_speech_stream,
            ("stt", "mark"): self._speech.mark,
            ("stt", "flush"): self._speech.flush,
            ("stt", "close"): self._speech.close,
            ("engine", "metrics"): self._metrics_exposition,
            ("engine", "sleep"): self._engines.sleep,
            ("engine", "wake_up"): self._engines.wake_up,
            ("llm", "tokenize"): lambda prompt, params, special: self._token_counter().tokenize(
                prompt, params, add_special_tokens=special
            ),
            ("llm", "context_tokens"): lambda: self._token_counter().context_tokens(),
            ("tts", "voice_list"): lambda: self._turn_engine("tts").voice_list(),
            ("tts", "add_voice"): lambda *a: self._turn_engine("tts").add_voice(*a),
            ("tts", "remove_voice"): lambda name: self._turn_engine("tts").remove_voice(name),
            ("policy", "infer"): self._policy_call(lambda p: lambda request: _validated_infer(p, request)),
            ("policy", "reset_session"): self._policy_call(lambda p: p.reset_session),
            ("policy", "client_connected"): self._policy_call(lambda p: p.client_connected),
            ("policy", "client_disconnected"): self._policy_call(lambda p: p.client_disconnected),
        }
        self._stream_calls: dict[tuple[str, str], Callable[..., AsyncIterator[Any]]] = {
            ("llm", "generate"): lambda messages, params, fit_history: self._turn_engine("llm").generate(
                messages, params, fit_history=fit_history
            ),
            ("tts", "synthesize"): lambda text, kwargs: self._turn_engine("tts").synthesize(text, **kwargs),
            ("asr", "transcribe"): lambda audio, kwargs: self._turn_engine("asr").transcribe(audio, **kwargs),
            ("tts_stream", "speak"): lambda inputs, *args: speak(self._tts_streams(), inputs, *args),
        }

    @property
    def session_count(self) -> int:
        return len(self._sessions) + self._releasing

    # ------------------------------------------------------------------ sending

    def send(self, message: tuple[Any, ...]) -> None:
        if self._closed:
            return
        transport = self._writer.transport
        if transport.get_write_buffer_size() > self._server.max_send_buffer_bytes:
            log.error("worker %d stopped reading its engine link; dropping it", self.worker_index)
            self._writer.close()
            self._closed = True
            return
        write(self._writer, message, self._server.metrics, "engine")

    def _queue_event(self, handle: int, event: Any) -> None:
        if not self._events:
            asyncio.get_running_loop().call_soon(self._flush_events)
        self._events.append((handle, event))

    def _flush_events(self) -> None:
        events, self._events = self._events, []
        # Lockstep output says when its engine's ticks are due: the worker times its uplink by it.
        tick = next((e.tick_due for _, e in reversed(events) if isinstance(e, OutputAudio)), None)
        self.send((Kind.EVENTS_OUT, *pack_events(events), tick))

    # ------------------------------------------------------------------ receiving

    async def run(self) -> None:
        while (message := await read_message(self._reader)) is not None:
            kind = message[0]
            if kind is Kind.FRAMES_IN:
                for handle, pcm in message[1]:
                    session: EngineSession | SpeechStream | None = self._sessions.get(handle)
                    if session is None:
                        session = self._speech.get(handle)
                    if session is not None:
                        try:
                            session.push_audio(pcm)
                        except EngineError as exc:  # workers check audio first; log what slips through
                            log.warning("engine refused pushed audio: %s", exc)
            elif kind is Kind.CALL:
                self._call(*message[1:])
            elif kind is Kind.STREAM_OPEN:
                self._open_stream(*message[1:])
            elif kind is Kind.STREAM_INPUT:
                stream = self._streams.get(message[1])
                if stream is not None:
                    stream.input.put_nowait(message[2])
            elif kind is Kind.STREAM_CREDIT:
                stream = self._streams.get(message[1])
                if stream is not None:
                    stream.credit(message[2])
            elif kind is Kind.STREAM_CANCEL:
                stream = self._streams.get(message[1])
                if stream is not None:
                    stream.task.cancel()
            elif kind is Kind.METRICS:
                self.metrics_text = message[2]
            elif kind is Kind.HELLO:
                self.worker_index = message[1]
                self.send((Kind.STATUS, self._server.offer()))

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._tasks, *(s.task for s in self._streams.values()), *self._pumps.values()]
        for task in tasks:
            task.cancel()
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*tasks, *(s.close() for s in sessions), self._speech.close_all(), return_exceptions=True)
        with contextlib.suppress(ConnectionError):
            self._writer.close()

    # ------------------------------------------------------------------ calls

    def _call(self, call_id: int | None, target: str, method: str, args: tuple[Any, ...]) -> None:
        handler = self._calls.get((target, method))
        if handler is None:
            self._reply_error(call_id, EngineError(f"unknown engine call {target}.{method}", code=ENGINE_ERROR))
            return
        try:
            result = handler(*args)
        except Exception as exc:  # noqa: BLE001 - sent back to the caller as its error
            self._reply_error(call_id, exc)
            return
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(lambda t: self._finish_call(call_id, t))
        elif call_id is not None:
            self.send((Kind.RESULT, call_id, result))

    def _finish_call(self, call_id: int | None, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._reply_error(call_id, exc)
        elif call_id is not None:
            if self._events:  # output a drain waited for goes out before the drain's answer
                self._flush_events()
            self.send((Kind.RESULT, call_id, task.result()))

    def _reply_error(self, call_id: int | None, exc: BaseException) -> None:
        if not isinstance(exc, EngineError):
            log.error("engine call failed", exc_info=exc)
        if call_id is not None:
            self.send((Kind.ERROR, call_id, RemoteError.wrap(exc)))

    def _metrics_exposition(self, worker_text: bytes) -> bytes:
        """Every process's metrics: the engine's own, this worker's (fresh), the others' (pushed each second)."""
        self.metrics_text = worker_text
        workers = {str(link.worker_index): link.metrics_text for link in self._server.links if link.metrics_text}
        return merge_expositions(generate_latest(self._engines.registry), workers)

    async def _open_session(self, session_id: str, options: Any) -> tuple[int, Any]:
        if self._server.draining:  # a front-end that had not seen the drain yet tries another engine
            raise CapacityExhausted("this engine is draining")
        session = await self._engines.session_engine.open_session(session_id, options)
        if self._closed:
            await session.close()
            raise EngineError("the worker link closed", code=ENGINE_UNAVAILABLE)
        handle = next(self._handles)
        self._sessions[handle] = session
        if isinstance(session, ForwardsEvents):  # lockstep: a tick's frames of every session in one callback
            session.forward_events(lambda event: self._queue_event(handle, event))
        else:
            self._pumps[handle] = asyncio.create_task(self._pump(handle, session))
        self._server.sessions_changed()  # the new load reaches this worker before the answer
        return handle, session.capabilities

    async def _open_speech_stream(self, stream_id: str) -> int:
        """A stream on the streaming STT (docs/engines.md#kyutai-stt-engine): its handle."""
        engine: SpeechStreamEngine = self._turn_engine("stt")
        stream = await engine.open_stream(stream_id)
        if self._closed:
            await stream.close(engine.release_timeout_s)
            raise EngineError("the worker link closed", code=ENGINE_UNAVAILABLE)
        handle = next(self._handles)
        self._speech.add(handle, stream, engine.release_timeout_s)
        return handle

    async def _pump(self, handle: int, session: EngineSession) -> None:
        try:
            async for event in session.events():
                self._queue_event(handle, event)
        finally:
            self._queue_event(handle, None)

    async def _close_session(self, handle: int) -> None:
        session = self._sessions.pop(handle, None)
        if session is None:
            return
        self._releasing += 1  # still counted until its slot is free: a front-end told sooner would be refused
        try:
            await session.close()
            pump = self._pumps.pop(handle, None)
            if pump is not None:  # the pump ends by itself once the session's events end
                await asyncio.gather(pump, return_exceptions=True)
        finally:
            self._releasing -= 1
            self._server.sessions_changed()

    def _session_call(self, method: str) -> Callable[..., Any]:
        def call(handle: int, *args: Any) -> Any:
            session = self._sessions.get(handle)
            if session is None:
                return None  # closed meanwhile: nothing left to apply it to
            return getattr(session, method)(*args)

        return call

    def _policy_call(self, pick: Callable[[Any], Callable[..., Any]]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            policy = self._engines.policy_batcher
            if policy is None:
                raise EngineError("Robot policy not available", code=POLICY_UNAVAILABLE)
            return pick(policy)(*args)

        return call

    def _tts_streams(self) -> TTSStreamEngine:
        engine = self._engines.speech_engine
        if engine is None:
            raise EngineError("this server has no Kyutai TTS engine", code=MODEL_NOT_FOUND)
        return engine

    def _token_counter(self) -> CountsTokens:
        return token_counter(self._turn_engine("llm"))

    def _turn_engine(self, name: str) -> Any:
        engine = getattr(self._engines.turn_engines, name)
        if engine is None:
            raise EngineError(f"this server has no {name} model loaded", code=MODEL_NOT_FOUND)
        return engine

    # ------------------------------------------------------------------ streams

    def _open_stream(self, stream_id: int, target: str, method: str, args: tuple[Any, ...], has_input: bool) -> None:
        factory = self._stream_calls.get((target, method))
        stream = _HostedStream(stream_id)
        self._streams[stream_id] = stream
        if has_input:
            args = (stream.input_items(), *args)
        stream.task = asyncio.create_task(self._run_stream(stream, factory, args))

    async def _run_stream(
        self, stream: _HostedStream, factory: Callable[..., AsyncIterator[Any]] | None, args: tuple[Any, ...]
    ) -> None:
        error: RemoteError | None = None
        try:
            if factory is None:
                raise EngineError("unknown engine stream", code=ENGINE_ERROR)
            items = factory(*args)
            try:
                async for item in items:
                    await stream.wait_for_credit()
                    self.send((Kind.STREAM_ITEM, stream.stream_id, item))
            finally:
                aclose = getattr(items, "aclose", None)
                if aclose is not None:
                    await aclose()
        except asyncio.CancelledError:
            error = RemoteError("cancelled", code=CANCELLED)
        except Exception as exc:
            if not isinstance(exc, EngineError):
                log.exception("engine stream failed")
            error = RemoteError.wrap(exc)
        finally:
            self._streams.pop(stream.stream_id, None)
        self.send((Kind.STREAM_END, stream.stream_id, error))


class _HostedStream:
    """One turn-engine stream: a credit window towards the worker, optional input from it."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.task: asyncio.Task[None]
        # Unbounded on purpose: input streams carry a request the worker already holds whole
        # (an uploaded file's windows), so it is bounded by the request size limit.
        self.input: asyncio.Queue[Any] = asyncio.Queue()
        self._credit = _STREAM_WINDOW
        self._credited = asyncio.Event()

    def credit(self, n: int) -> None:
        self._credit += n
        self._credited.set()

    async def wait_for_credit(self) -> None:
        while self._credit <= 0:
            self._credited.clear()
            await self._credited.wait()
        self._credit -= 1

    async def input_items(self) -> AsyncIterator[Any]:
        while (item := await self.input.get()) is not None:
            yield item


async def _validated_infer(batcher: Any, request: Any) -> Any:
    """Validation runs here, before batching, as it does in one process (workers cannot call
    the policy synchronously)."""
    try:
        batcher.policy.validate(request.observation)
    except EngineError:
        raise
    except Exception:
        log.exception("policy validate() raised an unexpected error")
        raise PolicyInferenceError("policy failed") from None
    return await batcher.infer(request)
