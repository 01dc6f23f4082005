"""OpenAI Realtime behaviours apps rely on (issue 16), driven by the official ``openai`` SDK
over a real socket; every GA event is validated against the SDK's own types (``SdkReader``).

The engine is the engine seam's scripted turn engine, so each test decides what the
"model" says and when: the behaviour under test is the session core's and the wire's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import openai
import pytest
import websockets
from openai.types.realtime import ConversationItemParam

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.cascade.turn_detection import TurnDetector
from rtserve.engines.turn_detection import TurnDetection
from tests.sessions.engine_double import TestDoubleEngine, TestDoubleEngineSession
from tests.support import serve_app
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import HANG_GUARD_S, pcm16_b64

RATE = 24_000


@contextlib.asynccontextmanager
async def scripted(config: ServerConfig) -> AsyncIterator[tuple[openai.AsyncOpenAI, TestDoubleEngine]]:
    engine = TestDoubleEngine(mode="turn", supports_server_vad=True)
    async with serve_app(build_app(config, engine=engine)) as base:
        yield openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=HANG_GUARD_S), engine


async def engine_session(engine: TestDoubleEngine) -> TestDoubleEngineSession:
    deadline = time.monotonic() + HANG_GUARD_S
    while not engine.sessions:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    return next(iter(engine.sessions.values()))


def ms(duration_ms: int) -> str:
    return pcm16_b64(np.full(RATE * duration_ms // 1000, 1000, np.int16))


async def open_session(conn: Any, **session: Any) -> SdkReader:
    reader = SdkReader(conn)
    assert (await reader.next())["type"] == "session.created"
    if session:
        await conn.session.update(session={"type": "realtime", **session})
        await reader.until("session.updated")
    return reader


async def test_commit_under_100_ms_is_refused_as_openai_does(config: ServerConfig) -> None:
    async with scripted(config) as (client, _), client.realtime.connect(model="x") as conn:
        reader = await open_session(conn, audio={"input": {"turn_detection": None}})
        await conn.input_audio_buffer.append(audio=ms(10))
        await conn.input_audio_buffer.commit(event_id="short")
        error = (await reader.until("error"))["error"]
        assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "short")
        assert error["message"] == (
            "Error committing input audio buffer: buffer too small. Expected at least "
            "100ms of audio, but buffer only has 10.00ms of audio."
        )
        await conn.input_audio_buffer.append(audio=ms(90))  # the refused commit kept the buffer
        await conn.input_audio_buffer.commit()
        assert (await reader.until("input_audio_buffer.committed"))["item_id"]


async def test_semantic_vad_is_accepted_and_echoed(config: ServerConfig) -> None:
    async with scripted(config) as (client, _engine), client.realtime.connect(model="x") as conn:
        reader = SdkReader(conn)
        await reader.next()
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low", "create_response": True}}
                },
            }
        )
        updated = await reader.until("session.updated")
        await conn.session.update(
            session={  # type: ignore[misc, arg-type]  # deliberately invalid: idle_timeout_ms is server_vad's, refused
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "semantic_vad", "idle_timeout_ms": 6000}}},
            }
        )
        refused = (await reader.until("error"))["error"]
    assert updated["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "low",
        "create_response": True,
        "interrupt_response": True,
    }
    assert (refused["code"], refused["param"]) == (
        "invalid_value",
        "session.audio.input.turn_detection.idle_timeout_ms",
    )


def test_semantic_vad_eagerness_sets_the_pause_that_ends_a_turn() -> None:
    window = 512  # Silero's window at 16 kHz: 32 ms

    def turn_ends_after(settings: TurnDetection) -> int:
        detector = TurnDetector(settings, 16000, window, 16000 * 30)
        scores = np.array([0.9] * 10 + [0.0] * 100, np.float32)
        for i, score in enumerate(scores):
            happened = detector.feed(np.zeros((1, window), np.float32), np.array([score]), i * window)
            if any(type(h).__name__ == "SpeechStopped" for h in happened):
                return (i - 9) * 32  # silence (ms) heard when the turn ended
        raise AssertionError("the turn never ended")

    eager = turn_ends_after(TurnDetection(type="semantic_vad", eagerness="high"))
    patient = turn_ends_after(TurnDetection(type="semantic_vad", eagerness="low"))
    medium = turn_ends_after(TurnDetection(type="semantic_vad"))
    assert eager < medium < patient
    assert 500 <= eager < 600 and 2000 <= patient < 2100


async def test_idle_timeout_triggers_a_response_after_the_answer_played(config: ServerConfig) -> None:
    async with scripted(config) as (client, engine), client.realtime.connect(model="x") as conn:
        reader = await open_session(
            conn, audio={"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 300}}}
        )
        session = await engine_session(engine)
        assert reader.events[-1]["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 300
        await conn.input_audio_buffer.append(audio=ms(200))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        first = (await reader.until("response.created"))["response"]["id"]
        while not session.responses:
            await asyncio.sleep(0.01)
        session.audio(first, samples=RATE // 2)  # half a second of answer: playback ends after it
        session.finish(first)
        finished_at = None
        await reader.until("response.done")
        finished_at = time.monotonic()
        triggered = await reader.until("input_audio_buffer.timeout_triggered")
        fired_after = time.monotonic() - finished_at
        committed = await reader.until("input_audio_buffer.committed")
        second = await reader.until("response.created")
    assert triggered["item_id"] == committed["item_id"]
    assert (triggered["audio_start_ms"], triggered["audio_end_ms"]) == (200, 200)  # nothing new was buffered
    assert second["response"]["id"] != first
    assert 0.5 <= fired_after < HANG_GUARD_S  # 300 ms after the ~500 ms of playback, not at response.done


async def test_speech_disarms_the_idle_timeout(config: ServerConfig) -> None:
    from rtserve.engines.events import SpeechStarted

    async with scripted(config) as (client, engine), client.realtime.connect(model="x") as conn:
        reader = await open_session(
            conn, audio={"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 200}}}
        )
        session = await engine_session(engine)
        await conn.input_audio_buffer.append(audio=ms(200))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        response_id = (await reader.until("response.created"))["response"]["id"]
        while not session.responses:
            await asyncio.sleep(0.01)
        session.finish(response_id)
        await reader.until("response.done")
        session.emit(SpeechStarted(200))  # the user speaks: no timeout
        await reader.until("input_audio_buffer.speech_started")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.until("input_audio_buffer.timeout_triggered"), 0.8)


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, "session.audio.input.noise_reduction"),
        ({"audio": {"output": {"speed": 1.25}}}, "session.audio.output.speed"),
        (
            {"audio": {"input": {"transcription": {"model": "whisper-1", "language": "fr"}}}},
            "session.audio.input.transcription.language",
        ),
        (
            {"audio": {"input": {"transcription": {"model": "whisper-1", "prompt": "names: Aoife"}}}},
            "session.audio.input.transcription.prompt",
        ),
    ],
)
async def test_audio_options_the_server_cannot_honour_are_refused(
    config: ServerConfig, session: dict, param: str
) -> None:
    async with scripted(config) as (client, _), client.realtime.connect(model="x") as conn:
        reader = await open_session(conn)
        await conn.session.update(
            session={"type": "realtime", **session},  # type: ignore[misc, arg-type]  # untyped parameters: refused options
            event_id="upd",
        )
        error = (await reader.until("error"))["error"]
    assert (error["type"], error["code"], error["param"], error["event_id"]) == (
        "invalid_request_error",
        "invalid_value",
        param,
        "upd",
    )


async def test_transcription_setting_is_echoed_and_null_turns_transcripts_off(config: ServerConfig) -> None:
    async with scripted(config) as (client, _), client.realtime.connect(model="x") as conn:
        reader = await open_session(
            conn,
            audio={
                "input": {
                    "turn_detection": None,
                    "noise_reduction": None,
                    "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                },
                "output": {"speed": 1.0},
            },
        )
        assert reader.events[-1]["session"]["audio"]["input"]["transcription"] == {"model": "gpt-4o-transcribe"}
        await conn.input_audio_buffer.append(audio=ms(200))
        await conn.input_audio_buffer.commit()
        done = await reader.until("conversation.item.input_audio_transcription.completed")
        assert done["transcript"] == "hello there"

        # null turns transcription off, as OpenAI's API takes it: the SDK's type has no None there.
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": None}}})  # type: ignore[misc, arg-type]
        assert (await reader.until("session.updated"))["session"]["audio"]["input"]["transcription"] is None
        await conn.input_audio_buffer.append(audio=ms(200))
        await conn.input_audio_buffer.commit()
        await reader.until("input_audio_buffer.committed")
        await conn.response.create()
        await reader.until("response.created")  # starts only once the (silent) transcript arrived
    types = [e["type"] for e in reader.events]
    assert types.count("conversation.item.input_audio_transcription.completed") == 1


async def test_a_listening_client_is_not_expired_for_silence_but_at_the_maximum_duration(config: ServerConfig) -> None:
    config.sessions.idle_ttl_s = 0.1  # duplex sessions only
    config.sessions.max_session_duration_s = 0.6
    config.sessions.reaper_interval_s = 0.05
    async with scripted(config) as (client, _), client.realtime.connect(model="x") as conn:
        reader = await open_session(conn)
        opened = time.monotonic()
        error = (await reader.until("error"))["error"]
        lived = time.monotonic() - opened
        with pytest.raises(websockets.exceptions.ConnectionClosedOK):
            await reader.next()  # the server closes the socket after it
    assert error == {
        "type": "invalid_request_error",
        "code": "session_expired",
        "message": "Your session hit the maximum duration of 0.01 minutes.",
        "param": None,
        "event_id": None,
    }
    assert lived >= 0.4  # not the 0.1 s idle TTL
    assert "session.expired" not in [e["type"] for e in reader.events]


async def test_out_of_band_response_has_its_own_context_and_stays_out_of_the_conversation(config: ServerConfig) -> None:
    from rtserve.engines.events import OutputText

    async with scripted(config) as (client, engine), client.realtime.connect(model="x") as conn:
        reader = await open_session(conn, instructions="Be kind.", audio={"input": {"turn_detection": None}})
        session = await engine_session(engine)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "I love bananas."}]}
        )
        user_item = (await reader.until("conversation.item.added"))["item"]["id"]
        await conn.response.create(
            response={
                "conversation": "none",
                "metadata": {"topic": "classification"},
                "output_modalities": ["text"],
                "instructions": "Classify the topic.",
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Topic?"}]},
                    {"type": "item_reference", "id": user_item},
                ],
            }
        )
        created = (await reader.until("response.created"))["response"]
        while not session.responses:
            await asyncio.sleep(0.01)
        oob = session.responses[0]
        session.emit(OutputText("fruit", session.epoch, oob.response_id))
        session.finish(oob.response_id)
        done = (await reader.until("response.done"))["response"]
        oob_events = reader.events[-8:]

        await conn.response.create()
        await reader.until("response.created")
        while len(session.responses) < 2:
            await asyncio.sleep(0.01)
        regular = session.responses[1]
    assert [(m.role, m.content) for m in oob.messages] == [
        ("system", "Classify the topic."),
        ("user", "Topic?"),
        ("user", "I love bananas."),
    ]
    assert created["metadata"] == done["metadata"] == {"topic": "classification"}
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == "fruit"
    added = [e for e in oob_events if e["type"] in ("conversation.item.added", "conversation.item.done")]
    assert added == []  # never part of the default conversation
    assert [(m.role, m.content) for m in regular.messages] == [("system", "Be kind."), ("user", "I love bananas.")]


async def test_response_input_is_held_to_the_conversation_bounds(config: ServerConfig) -> None:
    config.sessions.max_conversation_items = 2
    async with scripted(config) as (client, _), client.realtime.connect(model="x") as conn:
        reader = await open_session(conn)
        message: ConversationItemParam = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "x"}],
        }
        await conn.response.create(response={"conversation": "none", "input": [message] * 3}, event_id="big")
        error = (await reader.until("error"))["error"]
        await conn.response.create(response={"conversation": "elsewhere"}, event_id="bad")
        bad = (await reader.until("error"))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "conversation_limit_exceeded",
        "response.input",
        "big",
    )
    assert (bad["code"], bad["param"]) == ("invalid_value", "response.conversation")


async def test_input_audio_item_with_its_transcript_enters_the_conversation(config: ServerConfig) -> None:
    async with scripted(config) as (client, engine), client.realtime.connect(model="x") as conn:
        reader = await open_session(conn, audio={"input": {"turn_detection": None}})
        session = await engine_session(engine)
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": ms(200), "transcript": "Is it raining?"}],
            }
        )
        added = (await reader.until("conversation.item.added"))["item"]
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": ms(200)}]},
            event_id="no-asr",
        )
        refused = (await reader.until("error"))["error"]
        await conn.response.create()
        await reader.until("response.created")
        while not session.responses:
            await asyncio.sleep(0.01)
    assert added["content"] == [{"type": "input_audio", "transcript": "Is it raining?"}]
    assert (refused["code"], refused["param"], refused["event_id"]) == ("invalid_value", "item.content", "no-asr")
    assert [(m.role, m.content) for m in session.responses[0].messages][-1] == ("user", "Is it raining?")
