"""``PiperSpeechStream`` (``WS /api/tts_streaming`` on the turn-engine TTS) over a TTS double that
speaks 10 ms of audio per character: sentence order, estimated word times, the backlog bound."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import numpy as np
import pytest

from rtserve.engines.cascade.tts_stream import FRAME, PiperSpeechStreams
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.stream import SpeechAudio, SpeechEvent, SpokenWord
from rtserve.engines.values import Pcm, VoiceInfo

RATE = 24_000
PER_CHAR = RATE // 100


class CharTTS:
    """10 ms of audio per character of each sentence; records what it was asked to say."""

    model_name: str = "chars"
    sample_rate: int = RATE
    voices: tuple[str, ...] = ("joe",)

    def __init__(self) -> None:
        self.said: list[tuple[str, str | None]] = []

    async def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncGenerator[Pcm, None]:
        self.said.append((text, voice))
        yield np.full(len(text) * PER_CHAR, 0.1, np.float32)

    async def voice_list(self) -> list[VoiceInfo]:
        return [VoiceInfo("joe", builtin=True)]

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        raise AssertionError("not used")

    async def remove_voice(self, name: str) -> None:
        raise AssertionError("not used")


async def _all(events: AsyncGenerator[SpeechEvent, None]) -> list[SpeechEvent]:
    return [event async for event in events]


async def test_sentences_are_spoken_in_order_with_words_spread_by_length() -> None:
    tts = CharTTS()
    stream = await PiperSpeechStreams(tts, max_pending_words=16).open_stream("s", "joe")
    stream.send_text("Hi **there**. A")
    stream.send_text("b cc")
    stream.end()
    events = await _all(stream.events())
    assert tts.said == [("Hi there.", "joe"), ("A b cc", "joe")]
    words = [e for e in events if isinstance(e, SpokenWord)]
    audio = [e.pcm for e in events if isinstance(e, SpeechAudio)]
    assert all(pcm.size <= FRAME for pcm in audio)
    assert sum(pcm.size for pcm in audio) == (9 + 6) * PER_CHAR
    # "Hi there." is 0.09 s: "Hi" 2 of its 8 word characters; the next sentence starts after it.
    assert [w.text for w in words] == ["Hi", "there.", "A", "b", "cc"]
    times = [t for w in words for t in (w.start_s, w.stop_s)]
    assert times == pytest.approx([0.0, 0.0225, 0.0225, 0.09, 0.09, 0.105, 0.105, 0.12, 0.12, 0.15])
    assert isinstance(events[0], SpokenWord) and isinstance(events[-1], SpeechAudio)


async def test_an_end_without_text_ends_the_events_silently() -> None:
    stream = await PiperSpeechStreams(CharTTS(), max_pending_words=16).open_stream("s", None)
    stream.end()
    assert await _all(stream.events()) == []


async def test_an_unknown_voice_is_refused_at_open() -> None:
    with pytest.raises(EngineError) as refused:
        await PiperSpeechStreams(CharTTS(), max_pending_words=16).open_stream("s", "nobody")
    assert refused.value.code == "voice_not_found" and "joe" in refused.value.message


async def test_the_backlog_and_the_end_of_stream_are_enforced() -> None:
    stream = await PiperSpeechStreams(CharTTS(), max_pending_words=8).open_stream("s", None)
    stream.send_text("one two three. four five six.")
    with pytest.raises(EngineError) as backlog:
        stream.send_text("seven eight nine.")
    assert backlog.value.code == "input_backpressure"
    events = stream.events()
    assert isinstance(await anext(events), SpokenWord)  # the first sentence is being spoken
    while isinstance(await anext(events), SpokenWord):
        pass
    stream.send_text("seven eight nine.")  # three words were spoken: room again
    stream.end()
    with pytest.raises(EngineError) as after:
        stream.send_text("more")
    assert after.value.code == "stream_already_ended"
    with pytest.raises(EngineError) as twice:
        stream.end()
    assert twice.value.code == "stream_already_ended"
    rest = await _all(events)
    assert [e.text for e in rest if isinstance(e, SpokenWord)] == ["four", "five", "six.", "seven", "eight", "nine."]
    await stream.close()
