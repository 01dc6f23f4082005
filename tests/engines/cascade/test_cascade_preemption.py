"""The preemptive reply with the real models: started in the pause that ends a turn, heard
only when the session asks for exactly it, dropped unheard when the user goes on speaking."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rtserve.engines.events import InputTranscript, OutputAudio, OutputText, ResponseFinished, SpeechStopped
from rtserve.engines.protocols import EngineSession
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import ChatMessage, ResponseRequest, SamplingParams, SessionOptions
from tests.engines.cascade.cascade_support import (
    CHUNK,
    QUESTION,
    Loaded,
    Recorder,
    heard_most_of,
    opened,
    speak_16k,
    words,
)

pytestmark = pytest.mark.models

PARAMS = SamplingParams(temperature=0.0, max_tokens=24)
PREEMPTIVE = "rtserve_cascade_preemptive_replies_total"
# A long end-of-turn wait, so the pause transcript and the reply it starts surely come first
# (on a loaded machine a decode can take seconds).
OPTIONS = SessionOptions(server_vad=TurnDetection(type="server_vad", silence_duration_ms=8000), sampling=PARAMS)


def preemptive(cascade: Loaded) -> tuple[float, float]:
    return cascade.metric(PREEMPTIVE, outcome="adopted"), cascade.metric(PREEMPTIVE, outcome="dropped")


async def push_paced(session: EngineSession, audio: np.ndarray, *, real_time: bool = False) -> None:
    for start in range(0, len(audio), CHUNK):
        session.push_audio(audio[start : start + CHUNK])
        await asyncio.sleep(CHUNK / 16_000 if real_time else 0.005)


async def finish_turn(session: EngineSession, recorder: Recorder) -> str:
    """Silence until the turn ends, then commit it as the session core does; its final transcript."""
    silence = np.zeros(CHUNK, np.float32)
    async with asyncio.timeout(60):
        while not recorder.of(SpeechStopped):
            await push_paced(session, silence)
    await session.commit_input()
    final = await recorder.wait_for(lambda e: isinstance(e, InputTranscript) and e.final)
    assert isinstance(final, InputTranscript)
    return final.text


async def test_the_answer_is_under_way_before_the_turn_ends_and_audio_leads_the_text(cascade: Loaded) -> None:
    said = "Tell me a story about a dragon."
    question = await speak_16k(cascade.engine, said)
    adopted, dropped = preemptive(cascade)
    async with opened(cascade, OPTIONS, "preempt-adopt") as session:
        recorder = Recorder(session)
        await push_paced(session, question)
        heard = await finish_turn(session, recorder)
        assert heard_most_of(heard, said), heard
        assert not recorder.of(OutputAudio)  # nothing of the early reply was heard before it was asked for

        session.respond(ResponseRequest("answer", 0, (ChatMessage("user", heard),), params=PARAMS))
        finished = await recorder.wait_for(lambda e: isinstance(e, ResponseFinished), timeout=180)
        assert isinstance(finished, ResponseFinished)
        assert finished.status == "completed" and finished.usage["output_tokens"] > 0
    # The reply the session asked for had been started in the pause, before the turn ended.
    assert preemptive(cascade) == (adopted + 1, dropped)
    reply = [e for e in recorder.events if isinstance(e, OutputAudio | OutputText)]
    assert {e.response_id for e in reply} == {"answer"}
    # Audio starts before the reply's text is done: the first clause is spoken while the LLM writes on.
    first_audio = next(i for i, e in enumerate(reply) if isinstance(e, OutputAudio))
    last_text = max(i for i, e in enumerate(reply) if isinstance(e, OutputText))
    assert first_audio < last_text
    spoken = "".join(e.text or "" for e in reply if isinstance(e, OutputAudio))
    written = "".join(e.text for e in reply if isinstance(e, OutputText))
    assert spoken.strip() and words(spoken) <= words(written)


async def test_speaking_on_after_a_pause_drops_the_early_reply_unheard(
    cascade: Loaded, question_16k: np.ndarray
) -> None:
    said_next = "And what about Germany?"
    go_on = await speak_16k(cascade.engine, said_next)
    adopted, dropped = preemptive(cascade)
    async with opened(cascade, OPTIONS, "preempt-drop") as session:
        recorder = Recorder(session)
        await push_paced(session, question_16k)
        started = cascade.metric(PREEMPTIVE, outcome="started")
        silence = np.zeros(CHUNK, np.float32)
        async with asyncio.timeout(60):  # pause (short of the 8 s end of turn) until an early reply runs
            while cascade.metric(PREEMPTIVE, outcome="started") == started:
                await push_paced(session, silence, real_time=True)
        assert not recorder.of(SpeechStopped)
        await push_paced(session, go_on)  # ... and the user goes on speaking
        heard = await finish_turn(session, recorder)
        # The whole utterance, both halves, in the one transcript.
        assert heard_most_of(heard, QUESTION) and len(words(heard) & (words(said_next) - words(QUESTION))) >= 2, heard
        assert len(recorder.of(SpeechStopped)) == 1  # one turn

        session.respond(ResponseRequest("answer", 0, (ChatMessage("user", heard),), params=PARAMS))
        finished = await recorder.wait_for(lambda e: isinstance(e, ResponseFinished), timeout=180)
        assert isinstance(finished, ResponseFinished)
        assert finished.status == "completed"
    adopted_now, dropped_now = preemptive(cascade)
    assert dropped_now == dropped + 1  # the reply to the first half was never heard
    assert adopted_now <= adopted + 1  # the one heard (maybe started in the final pause) answers it all
    assert {e.response_id for e in recorder.events if isinstance(e, OutputAudio | OutputText)} == {"answer"}
