"""``StreamAsr`` (docs/engines.md#cascade-streaming-asr) on a scripted ``SpeechStream``: words
become partial transcripts that extend each other, a turn's transcript is the words said
before its marker came back, ``clear`` drops the words so far, the end-of-turn probability
follows the steps, and a failed stream fails the turns waiting on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import pytest

from rtserve.engines.cascade.stream_asr import WORD_END_MARGIN_S, StreamAsr
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineEvent, EngineFailure, InputTranscript
from rtserve.engines.kyutai_stt.events import Marker, Step, SttEvent, Word
from rtserve.engines.kyutai_stt.service import SpeechStream
from rtserve.engines.values import Pcm


class ScriptedStream:
    """A ``SpeechStream`` whose events the test sends; a marker is answered when the test says."""

    def __init__(self) -> None:
        self.events_in: asyncio.Queue[SttEvent | EngineError] = asyncio.Queue()
        self.pushed = 0
        self.marks: list[int] = []
        self.marked_at: list[int | None] = []  # each mark's samples (None: everything pushed)
        self.flushed_after: list[int] = []  # the marks made before each flush
        self.closed = False

    @property
    def pending_markers(self) -> int:
        return len(self.marks)

    def push_audio(self, pcm: Pcm) -> None:
        self.pushed += pcm.size

    def mark(self, marker_id: int, samples: int | None = None) -> None:
        self.marks.append(marker_id)
        self.marked_at.append(samples)

    def flush(self) -> None:
        self.flushed_after.append(len(self.marks))

    async def events(self) -> AsyncGenerator[SttEvent, None]:
        while True:
            event = await self.events_in.get()
            if isinstance(event, EngineError):
                raise event
            yield event

    async def close(self, release_timeout_s: float) -> None:
        self.closed = True


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
async def heard() -> AsyncGenerator[tuple[StreamAsr, ScriptedStream, list[EngineEvent]], None]:
    stream = ScriptedStream()
    typed: SpeechStream = stream
    reported: list[EngineEvent] = []
    asr = StreamAsr(typed, 16000, 24000, 1.0, reported.append)
    yield asr, stream, reported
    await asr.close()
    assert stream.closed


async def test_words_extend_each_other_and_a_turn_is_the_words_before_its_marker(
    heard: tuple[StreamAsr, ScriptedStream, list[EngineEvent]],
) -> None:
    asr, stream, reported = heard
    asr.push(np.zeros(16000, np.float32))
    await _settle()
    assert 23000 <= stream.pushed <= 24000  # resampled to the model's rate (the resampler holds a tail back)
    for word in ("hello", "there"):
        stream.events_in.put_nowait(Word(word, 0.0))
    stream.events_in.put_nowait(Step(1, (0.8, 0.1, 0.1), 0))
    turn = asr.finish_turn()
    await _settle()
    assert not turn.done() and stream.marks == [1]
    stream.events_in.put_nowait(Word("friend", 0.0))  # said before the marker: still this turn's
    stream.events_in.put_nowait(Marker(1))
    stream.events_in.put_nowait(Word("next", 0.0))  # the next turn's first word
    assert await asyncio.wait_for(turn, 5) == "hello there friend"
    await _settle()
    assert reported == [
        InputTranscript("hello", False),
        InputTranscript(" there", False),
        InputTranscript(" friend", False),
        InputTranscript("next", False),
    ]
    assert asr.end_of_turn == pytest.approx(0.8)


async def test_clear_drops_the_words_heard_so_far(heard: tuple[StreamAsr, ScriptedStream, list[EngineEvent]]) -> None:
    asr, stream, _reported = heard
    stream.events_in.put_nowait(Word("dropped", 0.0))
    await _settle()
    asr.clear()
    stream.events_in.put_nowait(Word("kept", 0.0))
    turn = asr.finish_turn()
    await _settle()
    stream.events_in.put_nowait(Marker(stream.marks[-1]))
    assert await asyncio.wait_for(turn, 5) == "kept"


async def test_a_failed_stream_is_reported_and_fails_the_waiting_turn(
    heard: tuple[StreamAsr, ScriptedStream, list[EngineEvent]],
) -> None:
    asr, stream, reported = heard
    turn = asr.finish_turn()
    await _settle()
    stream.events_in.put_nowait(EngineError("the slot went away", code="engine_error"))
    with pytest.raises(EngineError):
        await asyncio.wait_for(turn, 5)
    assert isinstance(reported[-1], EngineFailure) and reported[-1].code == "engine_error"


async def test_a_turn_the_vad_ended_after_silence_is_marked_where_its_speech_ended(
    heard: tuple[StreamAsr, ScriptedStream, list[EngineEvent]],
) -> None:
    """The model heard the silence while the VAD waited it out: the turn's marker goes where its
    speech ended (plus the margin for the last word's end), so its words are out sooner. A turn
    ended with no such silence flushes the stream instead."""
    asr, stream, _reported = heard
    asr.push(np.zeros(16000, np.float32))
    await _settle()
    turns = [asr.finish_turn(silence) for silence in (0.5, 0.1, 0.0)]
    await _settle()
    behind = round((0.5 - WORD_END_MARGIN_S) * 24000)
    # Silence shorter than the margin, or none (a manual commit): everything pushed, and the
    # model's delay is flushed rather than waited in real time.
    assert stream.marked_at == [stream.pushed - behind, None, None]
    assert stream.flushed_after == [2, 3]
    for turn in turns:
        turn.cancel()
