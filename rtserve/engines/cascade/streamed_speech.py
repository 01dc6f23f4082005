"""A reply spoken as the LLM writes it, on a streaming TTS engine (``cascade.tts: tts_engine``;
docs/engines.md#kyutai-tts-in-the-cascade).

Each token delta's whole words go to the stream the moment they arrive (no sentence wait: the
engine starts a word once it holds the next one, its lookahead) and the deltas pass on in order.
A word is sent once a space (or the reply's end) shows it whole: an LLM's tokens often split a
word (" Par", "is"), and the stream takes each message as whole words, as moshi-server's protocol
does, so a piece sent as it came would be spoken as two words. The stream opens
when the reply starts, while the LLM is still on its first token, so the connection and the row's
voice set-up are done before the first words come; a reply that says nothing closes it unused. The stream's audio
comes back in ``chunk_samples`` pieces; each word the engine reports spoken rides on the next
piece (the last words on an empty piece at the end), so the item's text grows with its audio as
the session core's truncation expects. Closing the generator (a barge-in cancels the reply's
stages) closes the stream: its lease is released at once, so no frame made after that is
delivered (the lockstep epoch fence) and the row is freed between two steps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.cascade.sentences import without_markup
from rtserve.engines.errors import CapacityExhausted
from rtserve.engines.kyutai_tts.service import SpeechStream, SpeechStreams
from rtserve.engines.kyutai_tts.stream import SpokenWord
from rtserve.engines.values import TokenDelta

Spoken = tuple[FloatArray, str | None]  # a piece of audio and the words it completes, if any
_Item = TokenDelta | Spoken | BaseException | None


async def speak_streamed(
    streams: SpeechStreams,
    deltas: AsyncIterator[TokenDelta],
    voice: str | None,
    *,
    stream_id: str,
    chunk_samples: int,
    max_queued: int,
) -> AsyncGenerator[TokenDelta | Spoken, None]:
    """``deltas`` passed on in order, the speech of their text interleaved as it is made. The
    stream opens at once; its failure (an unknown voice) is raised when the first words are due,
    and not at all for a reply without words. Finding no free channel, it tries once more then:
    right after a barge-in the cut-off reply's channel is freed a moment after its close."""
    out: asyncio.Queue[_Item] = asyncio.Queue(max_queued)  # bounded: a slow reader holds the engine row

    def start_opening() -> asyncio.Task[SpeechStream]:
        return asyncio.create_task(streams.open_stream(stream_id, voice), name=f"{stream_id}-open")

    opening = start_opening()

    said = False  # a word was said already: the next one gets its space

    async def read(stream: SpeechStream) -> None:
        nonlocal said
        words = ""
        try:
            async for event in stream.events():
                if isinstance(event, SpokenWord):
                    words += f" {event.text}" if said or words else event.text
                    continue
                for start in range(0, len(event.pcm), chunk_samples):
                    said = said or bool(words)
                    await out.put((event.pcm[start : start + chunk_samples], words or None))
                    words = ""
            if words:
                await out.put((np.zeros(0, np.float32), words))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            await out.put(exc)

    async def feed() -> None:
        reader: asyncio.Task[None] | None = None

        async def send(text: str) -> None:
            nonlocal reader, opening
            try:
                stream = await opening
            except CapacityExhausted:  # a reply just cut off may still hold the channel: it is freed by now
                opening = start_opening()
                stream = await opening
            if reader is None:
                reader = asyncio.create_task(read(stream), name=f"{stream_id}-audio")
            stream.send_text(text)

        try:
            partial = ""  # the text's last word, until a space or the end shows it whole
            async for delta in deltas:
                await out.put(delta)
                text = partial + without_markup(delta.text)  # the engine would speak "**" and "#"
                whole, partial = _last_word_apart(text)
                if whole.strip():
                    await send(whole)
            if partial:
                await send(partial)
            if reader is not None:
                opening.result().end()
                await reader
            await out.put(None)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            await out.put(exc)
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    feeder = asyncio.create_task(feed(), name=f"{stream_id}-text")
    try:
        while (item := await out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        feeder.cancel()
        opening.cancel()  # still connecting: no stream is wanted any more (nothing once it is open)
        _, stream = await asyncio.gather(feeder, opening, return_exceptions=True)
        if not isinstance(stream, BaseException):
            with contextlib.suppress(asyncio.CancelledError):
                await stream.close()


def _last_word_apart(text: str) -> tuple[str, str]:
    """``text`` up to its last whitespace, and what follows it (maybe only part of a word)."""
    for index in range(len(text) - 1, -1, -1):
        if text[index].isspace():
            return text[: index + 1], text[index + 1 :]
    return "", text
