"""The cascade EngineSession end to end: speech in, turn events, transcript, spoken reply, barge-in."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rtserve.engines.cascade.audio import resample
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import (
    EngineEvent,
    InputTranscript,
    OutputAudio,
    OutputText,
    ResponseFinished,
    SpeechStarted,
    SpeechStopped,
)
from rtserve.engines.protocols import EngineSession
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import ChatMessage, ResponseRequest, SamplingParams, SessionOptions
from tests.engines.cascade.cascade_support import (
    MAX_SESSIONS,
    QUESTION,
    Loaded,
    Recorder,
    heard_most_of,
    opened,
    speak_16k,
    speak_into,
    whisper,
    words,
)

pytestmark = pytest.mark.models

SERVER_VAD = SessionOptions(
    server_vad=TurnDetection(type="server_vad", threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500)
)


async def test_spoken_question_gets_a_spoken_answer(cascade: Loaded, question_16k: np.ndarray) -> None:
    engine = cascade.engine
    assert engine.capabilities.input_sample_rate == 16_000 and engine.capabilities.output_sample_rate == 24_000
    async with opened(cascade, SERVER_VAD, "e2e") as session:
        recorder = Recorder(session)
        lead = np.zeros(16 * 400, np.float32)
        await speak_into(session, np.concatenate([lead, question_16k]))
        started = await recorder.wait_for(lambda e: isinstance(e, SpeechStarted))
        assert isinstance(started, SpeechStarted)
        stopped = await recorder.wait_for(lambda e: isinstance(e, SpeechStopped))
        assert isinstance(stopped, SpeechStopped)
        assert 250 <= started.audio_ms <= 700  # speech begins after the 400 ms lead-in
        assert stopped.audio_ms > started.audio_ms + 1000

        await session.commit_input()  # what the session core does after SpeechStopped
        final = await recorder.wait_for(lambda e: isinstance(e, InputTranscript) and e.final)
        assert isinstance(final, InputTranscript)
        assert heard_most_of(final.text, QUESTION), final.text

        session.respond(
            ResponseRequest(
                "resp-1", 0, (ChatMessage("user", final.text),), params=SamplingParams(temperature=0.0, max_tokens=40)
            )
        )
        finished = await recorder.wait_for(lambda e: isinstance(e, ResponseFinished))
        assert isinstance(finished, ResponseFinished)
        assert finished.status == "completed" and finished.response_id == "resp-1"
        assert finished.usage["output_tokens"] > 0 and finished.usage["input_tokens"] > 0

        audio = [e for e in recorder.of(OutputAudio) if e.response_id == "resp-1"]
        spoken_text = "".join(e.text or "" for e in audio).strip()
        written_text = "".join(e.text for e in recorder.of(OutputText)).strip()
        assert spoken_text and written_text
        assert words(spoken_text) <= words(written_text)
        assert all(len(e.pcm) <= 24_000 * 40 // 1000 for e in audio)
        reply = np.concatenate([e.pcm for e in audio])
        assert len(reply) > 24_000 // 2 and np.abs(reply).max() > 0.1
        # The reply audio really says the reply text.
        heard = await whisper(engine).decode(resample(reply, 24_000, 16_000), final=True)
        assert len(words(heard) & words(spoken_text)) >= len(words(spoken_text)) // 2


async def test_barge_in_stops_reply_audio_at_once(cascade: Loaded, question_16k: np.ndarray) -> None:
    async with opened(cascade, SERVER_VAD, "barge-in") as session:
        recorder = Recorder(session)
        session.respond(
            ResponseRequest(
                "long",
                0,
                (ChatMessage("user", "Tell me a long story about a dragon who learns to bake bread."),),
                params=SamplingParams(temperature=0.0, max_tokens=200),
            )
        )
        await recorder.wait_for(lambda e: isinstance(e, OutputAudio))

        # The user talks over the reply; on SpeechStarted the session core fences the epoch.
        fenced_at: list[int] = []

        def session_core(event: EngineEvent) -> None:
            if isinstance(event, SpeechStarted) and not fenced_at:
                session.set_epoch(1)
                fenced_at.append(len(recorder.events))

        recorder.on_event = session_core
        await speak_into(session, question_16k, silence_ms=700)
        await recorder.wait_for(lambda e: isinstance(e, SpeechStopped))
        assert fenced_at, "no SpeechStarted while the user spoke over the reply"
        after = recorder.events[fenced_at[0] :]
        assert not [e for e in after if isinstance(e, OutputAudio | OutputText) and e.epoch == 0]
        assert not [e for e in recorder.of(ResponseFinished) if e.response_id == "long"]
        tokens = cascade.metric("rtserve_cascade_llm_tokens_total")
        await asyncio.sleep(0.5)
        assert cascade.metric("rtserve_cascade_llm_tokens_total") == tokens  # the LLM stopped too

        # The next reply, in the new epoch, flows normally.
        session.respond(
            ResponseRequest(
                "next", 1, (ChatMessage("user", "Say hello."),), params=SamplingParams(temperature=0.0, max_tokens=8)
            )
        )
        finished = await recorder.wait_for(lambda e: isinstance(e, ResponseFinished))
        assert isinstance(finished, ResponseFinished)
        assert finished.response_id == "next" and finished.status == "completed"
        later = recorder.events[fenced_at[0] :]
        assert not [e for e in later if isinstance(e, OutputAudio) and e.epoch == 0]


async def test_set_epoch_purges_reply_audio_the_reader_has_not_taken_yet(cascade: Loaded) -> None:
    first_audio = "rtserve_cascade_first_audio_seconds_count"
    async with opened(cascade, SERVER_VAD, "slow-reader") as session:
        before = cascade.metric(first_audio)
        session.respond(
            ResponseRequest(
                "queued",
                0,
                (ChatMessage("user", "Tell me about the sea."),),
                params=SamplingParams(temperature=0.0, max_tokens=60),
            )
        )
        async with asyncio.timeout(60):
            while cascade.metric(first_audio) == before:  # reply audio is queued, nobody reads yet
                await asyncio.sleep(0.05)
        session.set_epoch(1)
        recorder = Recorder(session)
        session.respond(
            ResponseRequest(
                "fresh", 1, (ChatMessage("user", "Say hi."),), params=SamplingParams(temperature=0.0, max_tokens=4)
            )
        )
        await recorder.wait_for(lambda e: isinstance(e, ResponseFinished))
        assert all(e.epoch == 1 for e in recorder.events if isinstance(e, OutputAudio | OutputText | ResponseFinished))


async def test_manual_turns_commit_clear_and_text_only_replies(cascade: Loaded, question_16k: np.ndarray) -> None:
    async with opened(cascade, SessionOptions(server_vad=None), "manual") as session:
        recorder = Recorder(session)
        await speak_into(session, question_16k, silence_ms=100)
        session.clear_input()  # the client changed its mind: this audio is gone
        await session.commit_input()
        cleared = await recorder.wait_for(lambda e: isinstance(e, InputTranscript) and e.final)
        assert isinstance(cleared, InputTranscript)
        assert cleared.text == ""

        await speak_into(session, question_16k, silence_ms=100)
        await session.commit_input()
        final = await recorder.wait_for(lambda e: isinstance(e, InputTranscript) and e.final and e is not cleared)
        assert isinstance(final, InputTranscript)
        assert not recorder.of(SpeechStarted)  # no server VAD: the client commits
        assert heard_most_of(final.text, QUESTION), final.text

        session.respond(
            ResponseRequest(
                "text-only",
                0,
                (ChatMessage("user", final.text),),
                modalities=("text",),
                params=SamplingParams(temperature=0.0, max_tokens=12),
            )
        )
        finished = await recorder.wait_for(lambda e: isinstance(e, ResponseFinished))
        assert isinstance(finished, ResponseFinished)
        assert finished.status == "completed"
        assert recorder.of(OutputText) and not recorder.of(OutputAudio)


async def test_bad_input_is_typed_and_capacity_is_bounded(cascade: Loaded) -> None:
    engine = cascade.engine
    with pytest.raises(EngineError) as raised:
        # A raw OpenAI object, as SessionOptions accepts (and parses) one: an unsupported type is refused.
        await engine.open_session("bad-vad", SessionOptions(server_vad={"type": "turn_model"}))  # type: ignore[arg-type]
    assert raised.value.code == "unsupported_turn_detection"
    sessions = [await engine.open_session(f"cap-{i}", SERVER_VAD) for i in range(MAX_SESSIONS)]
    assert all(isinstance(s, EngineSession) for s in sessions)
    try:
        with pytest.raises(CapacityExhausted):
            await engine.open_session("one-too-many", SERVER_VAD)
        with pytest.raises(EngineError) as raised:
            sessions[0].push_audio(np.zeros((2, 160), np.float32))
        assert raised.value.code == "invalid_audio"
        sessions[0].push_audio(np.zeros(160, np.float32))  # the session still works
        recorder = Recorder(sessions[1])
        sessions[1].respond(ResponseRequest("bad-voice", 0, (ChatMessage("user", "Hi"),), voice="nobody"))
        finished = await recorder.wait_for(lambda e: isinstance(e, ResponseFinished))
        assert isinstance(finished, ResponseFinished)
        assert finished.status == "failed" and "voice" in (finished.reason or "")
    finally:
        for session in sessions:
            await session.close()
    again = await engine.open_session("after-close", SERVER_VAD)  # closing freed the slots
    await again.close()
    await again.close()  # idempotent


async def test_sessions_share_models_and_vad_settings_are_per_session(cascade: Loaded) -> None:
    speech = await speak_16k(cascade.engine, "Good morning to you.")
    eager = SessionOptions(server_vad=TurnDetection(type="server_vad", silence_duration_ms=200))
    patient = SessionOptions(server_vad=TurnDetection(type="server_vad", silence_duration_ms=1500))
    async with opened(cascade, eager, "eager") as first, opened(cascade, patient, "patient") as second:
        eager_events, patient_events = Recorder(first), Recorder(second)
        # 800 ms of trailing silence: enough for the eager session to end the turn, not the patient one.
        await asyncio.gather(speak_into(first, speech, silence_ms=800), speak_into(second, speech, silence_ms=800))
        await eager_events.wait_for(lambda e: isinstance(e, SpeechStopped))
        await second.commit_input()  # waits for every pushed sample to be analysed
        assert patient_events.of(SpeechStarted) and not patient_events.of(SpeechStopped)
