"""One worker link's speech-to-text streams on the engine process's STT engine.

The engine side of ``speech_streams.py``: each stream opened by the worker is kept under its
link handle; a task per stream forwards its events to the link (a failure as one
``EngineFailure``, then ``None``, as a pumped session ends). When the worker's link closes
(the worker died) every stream of it is closed and its slot freed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.kyutai_stt.service import SpeechStream


class _Hosted(NamedTuple):
    stream: SpeechStream
    pump: asyncio.Task[None]
    release_timeout_s: float  # its engine's


class HostedSpeechStreams:
    def __init__(self, send_event: Callable[[int, Any], None]) -> None:
        """``send_event(handle, event)``: queue one event for the worker (None: the stream ended)."""
        self._send_event = send_event
        self._streams: dict[int, _Hosted] = {}

    def add(self, handle: int, stream: SpeechStream, release_timeout_s: float) -> None:
        self._streams[handle] = _Hosted(stream, asyncio.create_task(self._pump(handle, stream)), release_timeout_s)

    def get(self, handle: int) -> SpeechStream | None:
        hosted = self._streams.get(handle)
        return None if hosted is None else hosted.stream

    def mark(self, handle: int, marker_id: int, samples: int | None) -> None:
        stream = self.get(handle)
        if stream is not None:
            stream.mark(marker_id, samples)

    def flush(self, handle: int) -> None:
        stream = self.get(handle)
        if stream is not None:
            stream.flush()

    async def close(self, handle: int) -> None:
        hosted = self._streams.pop(handle, None)
        if hosted is not None:
            await hosted.stream.close(hosted.release_timeout_s)
            await asyncio.gather(hosted.pump, return_exceptions=True)  # it ends with the stream's events

    async def close_all(self) -> None:
        streams, self._streams = self._streams, {}
        for hosted in streams.values():
            hosted.pump.cancel()
        await asyncio.gather(
            *(hosted.stream.close(hosted.release_timeout_s) for hosted in streams.values()),
            *(hosted.pump for hosted in streams.values()),
            return_exceptions=True,
        )

    async def _pump(self, handle: int, stream: SpeechStream) -> None:
        try:
            async for event in stream.events():
                self._send_event(handle, event)
        except EngineError as exc:
            self._send_event(handle, EngineFailure(exc.code, exc.message))
        finally:
            self._send_event(handle, None)
