"""``speak_streamed`` on the tiny Kyutai TTS engine (docs/engines.md#kyutai-tts-in-the-cascade):
text goes to the engine delta by delta, not sentence by sentence (the LLM here ends its sentence
only once audio of its first words came back), the deltas pass on in order with the audio, the
words ride on the audio, closing mid-speech frees the engine's one slot at once, and the stream
opens while the LLM is still on its first token."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from rtserve.config import ServerConfig
from rtserve.engines.cascade.streamed_speech import speak_streamed
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine
from rtserve.engines.kyutai_tts.stream import TTSStream
from rtserve.engines.values import TokenDelta
from rtserve.errors import VOICE_NOT_FOUND
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint

CHUNK = 960


@pytest.fixture
async def engine(tiny_tts_for_cascade: TinyTTS) -> AsyncIterator[KyutaiTTSEngine]:
    base = ServerConfig()
    config = base.model_copy(
        update={
            "tts_engine": base.tts_engine.model_copy(
                update={
                    "weights": str(tiny_tts_for_cascade.folder),
                    "voices": str(tiny_tts_for_cascade.voices),
                    "max_sessions": 1,
                    "temperature": 0.0,
                }
            )
        }
    )
    engine = KyutaiTTSEngine(config)
    await engine.start()
    assert engine.ready, engine.failure
    yield engine
    await engine.stop()


@pytest.fixture(scope="module")
def tiny_tts_for_cascade(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("streamed_speech") / "weights")


async def test_text_is_spoken_as_it_streams_in_with_the_deltas_in_order(engine: KyutaiTTSEngine) -> None:
    heard = asyncio.Event()

    async def llm() -> AsyncIterator[TokenDelta]:
        yield TokenDelta("the quick brown fox jumps over the lazy dog")  # no sentence end yet
        await asyncio.wait_for(heard.wait(), 60)  # a sentence-wise speaker would wait for the period forever
        yield TokenDelta(" again.")
        yield TokenDelta("", finish_reason="stop")

    out = []
    spoken = speak_streamed(engine, llm(), "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    async with contextlib.aclosing(spoken):
        async for item in spoken:
            out.append(item)
            if not isinstance(item, TokenDelta) and item[0].size:
                heard.set()
    deltas = [item.text for item in out if isinstance(item, TokenDelta)]
    assert deltas == ["the quick brown fox jumps over the lazy dog", " again.", ""]
    audio = [item for item in out if not isinstance(item, TokenDelta)]
    assert all(pcm.size <= CHUNK for pcm, _ in audio) and sum(pcm.size for pcm, _ in audio) > 10 * CHUNK
    assert "".join(words or "" for _, words in audio) == "the quick brown fox jumps over the lazy dog again."


async def test_closing_mid_speech_frees_the_slot_at_once(engine: KyutaiTTSEngine) -> None:
    async def llm() -> AsyncIterator[TokenDelta]:
        yield TokenDelta("the quick brown fox jumps over the lazy dog " * 4)
        await asyncio.Event().wait()  # the LLM is still writing when the user barges in

    spoken = speak_streamed(engine, llm(), "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    async with contextlib.aclosing(spoken):
        async for item in spoken:
            if not isinstance(item, TokenDelta) and item[0].size:
                break
    stream = await engine.open_stream("next", "alice")  # max_sessions is 1: free again
    await stream.close()


# A reply as an LLM's tokens come: some split a word (" Par", "is").
SPLIT_WORDS = ("The", " capital", " is", " Par", "is", ",", " France", "'s", " larg", "est", " city", ".")


async def split_words_llm() -> AsyncIterator[TokenDelta]:
    for piece in SPLIT_WORDS:
        yield TokenDelta(piece)
    yield TokenDelta("", finish_reason="stop")


async def test_a_word_split_across_tokens_is_spoken_as_one_word(engine: KyutaiTTSEngine) -> None:
    """The engine takes each piece of text as whole words, so a word is sent once a space or the
    end shows it whole: the words spoken are the reply's."""
    spoken = speak_streamed(engine, split_words_llm(), "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    async with contextlib.aclosing(spoken):
        out = [item async for item in spoken]
    words = "".join(item[1] or "" for item in out if not isinstance(item, TokenDelta))
    assert words == "".join(SPLIT_WORDS)


async def test_markup_the_llm_writes_is_not_spoken(engine: KyutaiTTSEngine) -> None:
    async def llm() -> AsyncIterator[TokenDelta]:
        for piece in ("**Paris**", " is the", " _capital_", " of `France`.", ""):
            yield TokenDelta(piece, finish_reason="stop" if not piece else None)

    spoken = speak_streamed(engine, llm(), "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    async with contextlib.aclosing(spoken):
        out = [item async for item in spoken]
    deltas = [item.text for item in out if isinstance(item, TokenDelta)]
    assert deltas == ["**Paris**", " is the", " _capital_", " of `France`.", ""]  # passed on as written
    assert (
        "".join(item[1] or "" for item in out if not isinstance(item, TokenDelta)) == "Paris is the capital of France."
    )


class _OpenWatch:
    """The engine, noting when its first open attempt has ended (opened or refused)."""

    def __init__(self, engine: KyutaiTTSEngine) -> None:
        self._engine = engine
        self.sample_rate = engine.sample_rate
        self.tried = asyncio.Event()

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> TTSStream:
        try:
            return await self._engine.open_stream(stream_id, voice, seed=seed)
        finally:
            self.tried.set()


async def test_the_stream_opens_while_the_llm_is_still_on_its_first_token(engine: KyutaiTTSEngine) -> None:
    """The connection and the row's voice are set up in the LLM's time to its first token, not
    after it (here the LLM answers only once the stream is open)."""
    streams = _OpenWatch(engine)

    async def llm() -> AsyncIterator[TokenDelta]:
        await asyncio.wait_for(streams.tried.wait(), 30)
        yield TokenDelta("hello there.", finish_reason="stop")

    spoken = speak_streamed(streams, llm(), "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    async with contextlib.aclosing(spoken):
        out = [item async for item in spoken]
    assert "".join(item[1] or "" for item in out if not isinstance(item, TokenDelta)) == "hello there."


async def test_a_reply_without_words_frees_its_stream_and_its_open_failure_is_nobodys(
    engine: KyutaiTTSEngine,
) -> None:
    async def silent_llm() -> AsyncIterator[TokenDelta]:
        yield TokenDelta("", finish_reason="stop")  # a tool call, say: nothing to speak

    for voice in ("alice", "nobody"):  # "nobody": no such voice, so the stream never opens
        spoken = speak_streamed(engine, silent_llm(), voice, stream_id="s", chunk_samples=CHUNK, max_queued=4)
        async with contextlib.aclosing(spoken):
            assert [item async for item in spoken] == [TokenDelta("", finish_reason="stop")]
    stream = await engine.open_stream("next", "alice")  # max_sessions is 1: free again
    await stream.close()

    async def llm() -> AsyncIterator[TokenDelta]:
        yield TokenDelta("hello there.", finish_reason="stop")

    spoken = speak_streamed(engine, llm(), "nobody", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    with pytest.raises(EngineError) as raised:  # with words to say, the voice's failure is the reply's
        async with contextlib.aclosing(spoken):
            [item async for item in spoken]
    assert raised.value.code == VOICE_NOT_FOUND


async def test_a_channel_freed_before_the_first_words_is_taken_then(engine: KyutaiTTSEngine) -> None:
    """Right after a barge-in the cut-off reply's stream may still hold the channel when the next
    reply starts (max_sessions is 1 here): the reply opens again when its first words come."""
    held = await engine.open_stream("cut-off", "alice")
    streams = _OpenWatch(engine)

    async def llm() -> AsyncIterator[TokenDelta]:
        await asyncio.wait_for(streams.tried.wait(), 30)  # the early open found the channel taken
        await held.close()
        yield TokenDelta("hello there.", finish_reason="stop")

    spoken = speak_streamed(streams, llm(), "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
    async with contextlib.aclosing(spoken):
        out = [item async for item in spoken]
    assert "".join(item[1] or "" for item in out if not isinstance(item, TokenDelta)) == "hello there."
