"""The engine process's streaming speech-to-text engine, seen from a worker.

One STT engine serves the whole server (docs/engines.md#kyutai-stt-engine): a worker's
``/api/asr-streaming`` and streamed transcription streams are handles on the engine link, as
engine sessions are. A stream's audio joins the worker's per-tick ``FRAMES_IN``; a marker is
a one-way command sent after the audio pushed before it (so it counts the same samples); its
events (``Step``, ``Word``, ``EndWord``, ``Marker``, and a failure as ``EngineFailure``) come
back in ``EVENTS_OUT``. The engine side is ``speech_stream_host.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.kyutai_stt.events import Marker, SttEvent
from rtserve.engines.lockstep.framing import check_audio
from rtserve.engines.remote.link import ENGINE_LOST_FAILURE, EngineLink, EngineUnavailable, engine_lost
from rtserve.engines.remote.offer import EngineOffer, SpeechStreamsInfo
from rtserve.engines.values import Pcm
from rtserve.errors import OUTPUT_BACKPRESSURE


class RemoteSpeechStream:
    """A ``SpeechStream`` living in the engine process."""

    def __init__(self, link: EngineLink, handle: int, max_queued_events: int) -> None:
        self._link = link
        self._handle = handle
        self._max_queued = max_queued_events
        self._events: deque[SttEvent | EngineFailure | None] = deque()
        self._arrived = asyncio.Event()
        self._markers = 0  # sent, not read back yet
        self._failed = False
        self._closed = False
        link.register_session(handle, self._receive)

    @property
    def pending_markers(self) -> int:
        return self._markers

    def _receive(self, event: Any) -> None:
        if self._failed:
            return
        if engine_lost(event):
            event = ENGINE_LOST_FAILURE
        elif len(self._events) >= self._max_queued:  # bounded: its reader stopped reading
            self._events.clear()
            event = EngineFailure(OUTPUT_BACKPRESSURE, "the stream's reader fell behind its events")
        self._failed = isinstance(event, EngineFailure)
        self._events.append(event)
        self._arrived.set()

    def push_audio(self, pcm: Pcm) -> None:
        samples = check_audio(pcm)  # InvalidAudio here, as in one process
        if not self._closed:
            self._link.uplink.push(self._handle, samples)

    def mark(self, marker_id: int, samples: int | None = None) -> None:
        if not self._closed:
            self._markers += 1
            self._link.command("stt", "mark", self._handle, marker_id, samples)  # flushes the audio before it first

    def flush(self) -> None:
        if not self._closed:
            self._link.command("stt", "flush", self._handle)

    async def events(self) -> AsyncGenerator[SttEvent, None]:
        while True:
            while not self._events:
                self._arrived.clear()
                await self._arrived.wait()
            event = self._events.popleft()
            if event is None:
                return
            if isinstance(event, EngineFailure):
                raise EngineError(event.message, code=event.code)
            if isinstance(event, Marker):
                self._markers -= 1
            yield event

    async def close(self, release_timeout_s: float) -> None:
        """Release the engine's slot (events not read yet are dropped; the engine process waits
        for the slot by its own ``release_timeout_s``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._link.uplink.drop(self._handle)
        with contextlib.suppress(EngineUnavailable):  # the engine process is gone, and its slots with it
            await self._link.call("stt", "close", self._handle)


class OfferedStreams:
    """A streaming engine of the engine process as a worker's routes see it: the engine process
    starts and stops it; whether it serves, and its rate, come with each offer (``pick``)."""

    def __init__(
        self, link: EngineLink, info: SpeechStreamsInfo, pick: Callable[[EngineOffer], SpeechStreamsInfo | None]
    ) -> None:
        self._link = link
        self._info = info
        self._pick = pick
        link.on_offer(self._offer_changed)

    def _offer_changed(self) -> None:
        offer = self._link.offer
        info = None if offer is None else self._pick(offer)
        if info is not None:
            self._info = info

    async def start(self) -> None:
        """The engine process starts it; readiness arrives with its offer."""

    async def stop(self) -> None:
        """The engine process stops it."""

    @property
    def ready(self) -> bool:
        return self._link.connected.is_set() and self._info.ready

    @property
    def failure(self) -> str | None:
        return self._info.failure if self._link.connected.is_set() else "the engine process is not reachable"

    @property
    def sample_rate(self) -> int:
        return self._info.sample_rate

    @property
    def release_timeout_s(self) -> float:
        return self._info.release_timeout_s


class RemoteSpeechStreams(OfferedStreams):
    """The engine process's ``SpeechStreamEngine`` (``TurnEngines.stt``) for a worker's routes."""

    def __init__(self, link: EngineLink, info: SpeechStreamsInfo, *, max_queued_events: int) -> None:
        super().__init__(link, info, lambda offer: offer.stt)
        self._max_queued = max_queued_events

    async def open_stream(self, stream_id: str) -> RemoteSpeechStream:
        handle = await self._link.call_opening(
            lambda opened: self._link.command("stt", "close", opened),
            "stt",
            "open_stream",
            stream_id,
        )
        return RemoteSpeechStream(self._link, handle, self._max_queued)
