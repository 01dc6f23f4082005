"""The engine process's Kyutai TTS engine behind ``/api/tts_streaming``, seen from a worker.

One TTS engine serves the whole server (docs/engines.md#kyutai-tts-over-http): a worker's
stream is a turn-engine stream of the link (``EngineLink.stream``), as ``/v1/audio/speech``
already is. Text and the end of stream go as its input, in order; the engine side
(``tts_stream_host.py``) answers ``OPENED`` once a slot is held, so a refusal
(``voice_not_found``, ``resource_exhausted``, ``engine_unavailable``) reaches the client typed
before ``Ready``; words and audio frames come back under the link's credit window; text the
engine refuses ends the stream with that error, a moment later than in one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from rtserve.engines.kyutai_tts.stream import SpeechEvent
from rtserve.engines.remote.link import EngineLink
from rtserve.engines.remote.offer import SpeechStreamsInfo
from rtserve.engines.remote.speech_streams import OfferedStreams
from rtserve.engines.remote.tts_stream_host import END_OF_TEXT


class RemoteTTSStream:
    """A ``SpeechStream`` living in the engine process."""

    def __init__(self, items: AsyncGenerator[Any, None], inputs: asyncio.Queue[str]) -> None:
        self._items = items
        self._inputs = inputs  # unbounded here: sent on at once; the engine bounds the words waiting
        self.ended = False

    def send_text(self, text: str) -> None:
        self._inputs.put_nowait(text)

    def end(self) -> None:
        self.ended = True
        self._inputs.put_nowait(END_OF_TEXT)  # a second one is the engine's to refuse

    async def events(self) -> AsyncIterator[SpeechEvent]:
        async for event in self._items:
            yield event

    async def close(self) -> None:
        await self._items.aclose()  # the engine process releases the slot


class RemoteTTSStreams(OfferedStreams):
    """The engine process's ``TTSStreamEngine`` for a worker's ``/api/tts_streaming``."""

    def __init__(self, link: EngineLink, info: SpeechStreamsInfo) -> None:
        super().__init__(link, info, lambda offer: offer.tts_streams)

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> RemoteTTSStream:
        inputs: asyncio.Queue[str] = asyncio.Queue()
        items = self._link.stream("tts_stream", "speak", stream_id, voice, seed, input_items=_sent(inputs))
        await anext(items)  # OPENED; a refusal raises here, typed, and the stream is over
        return RemoteTTSStream(items, inputs)


async def _sent(inputs: asyncio.Queue[str]) -> AsyncIterator[str]:
    """The stream's input, as the route sends it, until the stream closes."""
    while True:
        yield await inputs.get()
