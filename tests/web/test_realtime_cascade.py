"""``WS /v1/realtime`` on the embedded default cascade engine (Silero VAD, Whisper tiny.en,
SmolLM2-135M, Piper), driven by the official ``openai`` SDK: a spoken question (made by
the server's own TTS through the SDK) goes in, server VAD ends the turn, and the
transcript plus a spoken answer come back."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import openai
import pytest

from rtserve.config import ServerConfig
from tests.web.realtime_support import audio_of, pcm16_b64, running
from tests.web.test_realtime_sdk import SdkReader

pytestmark = pytest.mark.models

QUESTION = "What is the capital of France?"
CHUNK = 1920  # 80 ms at 24 kHz
LOAD_TIMEOUT_S = 300


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


async def test_spoken_question_gets_a_transcript_and_a_spoken_answer(config: ServerConfig) -> None:
    config.engine = "cascade"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=60)
        speech = await client.audio.speech.create(model="piper-joe", voice="joe", input=QUESTION,
                                                  response_format="pcm")
        question = np.frombuffer(speech.content, dtype="<i2")
        silence = np.zeros(24000, dtype=np.int16)  # lets server VAD see the end of the turn
        spoken = np.concatenate([silence[:4800], question, silence])
        async with client.realtime.connect(model="cascade") as conn:
            reader = SdkReader(conn)
            created = await reader.next()
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"

            async def speak() -> None:  # at real time: the engine's input backlog is bounded
                for start in range(0, len(spoken), CHUNK):
                    await conn.input_audio_buffer.append(audio=pcm16_b64(spoken[start:start + CHUNK]))
                    await asyncio.sleep(CHUNK / 24000)

            speaking = asyncio.create_task(speak())
            done = await asyncio.wait_for(reader.until("response.done", limit=20000), LOAD_TIMEOUT_S)
            await speaking
            events = list(reader.events)

            # Second turn, committed by hand: one response at a time, and a cancel mid-answer.
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            assert (await reader.until("session.updated"))["session"]["audio"]["input"]["turn_detection"] is None
            for start in range(0, len(question), CHUNK):
                await conn.input_audio_buffer.append(audio=pcm16_b64(question[start:start + CHUNK]))
                await asyncio.sleep(CHUNK / 24000 / 2)
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            second = (await reader.until("response.created"))["response"]["id"]
            await conn.response.create(event_id="too-soon")
            refused = (await reader.until("error"))["error"]
            await reader.until("response.output_audio.delta", limit=20000)
            await conn.response.cancel()
            cancelled = (await reader.until("response.done", limit=20000))["response"]
    manual = reader.events[len(events):]
    assert "input_audio_buffer.committed" in [e["type"] for e in manual]
    assert (refused["code"], refused["event_id"]) == ("conversation_already_has_active_response", "too-soon")
    assert (cancelled["id"], cancelled["status"]) == (second, "cancelled")
    names = [e["type"] for e in events]
    for name in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                 "response.created", "response.output_audio_transcript.done"):
        assert name in names, name
    transcript = next(e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert {"capital", "france"} <= words(transcript["transcript"])
    answer = next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
    assert words(answer)
    audio = audio_of(events).astype(np.float32) / 32768
    assert len(audio) > 24000 // 2 and np.sqrt(np.mean(audio ** 2)) > 0.01  # a spoken answer, not silence
    response: dict[str, Any] = done["response"]
    assert response["status"] == "completed"
    assert response["usage"]["output_tokens"] > 0 and response["usage"]["input_tokens"] > 0
