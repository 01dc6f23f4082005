"""A worker's ``/api/tts_streaming`` stream on the engine process's Kyutai TTS engine.

The stream is one of the link's turn-engine streams (``WorkerLink`` runs ``speak`` as it runs
``tts.synthesize``): its input items are the client's text and ``END_OF_TEXT``; its items are
``OPENED`` once it holds a slot, then the stream's words and audio frames, under the link's
credit window, so a worker that stops taking them holds the row back here. Text the stream
refuses (past its backlog, after its end) ends it with that error, as in one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.service import SpeechStream, SpeechStreams

OPENED = "opened"  # the first item: the stream holds its slot (refusals come before it, typed)
END_OF_TEXT = "end_of_text"  # an input item: the client's end of stream (any other is text)


async def speak(
    engine: SpeechStreams, inputs: AsyncIterator[Any], stream_id: str, voice: str | None, seed: int | None
) -> AsyncGenerator[Any, None]:
    stream = await engine.open_stream(stream_id, voice, seed=seed)
    refused: list[EngineError] = []
    feeder = asyncio.create_task(_feed(stream, inputs, refused))
    try:
        yield OPENED
        async for event in stream.events():
            yield event
        if refused:
            raise refused[0]
    finally:
        feeder.cancel()
        await stream.close()


async def _feed(stream: SpeechStream, inputs: AsyncIterator[Any], refused: list[EngineError]) -> None:
    async for item in inputs:
        try:
            if item == END_OF_TEXT:
                stream.end()
            else:
                stream.send_text(item)
        except EngineError as exc:
            refused.append(exc)
            await stream.close()  # its events end; ``speak`` raises the refusal
            return
