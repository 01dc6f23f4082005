"""The voice agent of issue 34 on CPU: ``WS /v1/realtime`` on the cascade hearing with the tiny
Kyutai STT (``cascade.asr: stt_engine``, docs/engines.md#cascade-streaming-asr) and speaking with
the tiny Kyutai TTS (``cascade.tts: tts_engine``, docs/engines.md#kyutai-tts-in-the-cascade) at
once, driven by the official ``openai`` SDK: a spoken request goes in, its transcript comes back
word by word, the reply comes back as audio, and speech over that reply cuts it off (barge-in).
Both models are tiny and random: events, their order and their sums are asserted, never words.

The spoken audio is Piper's (the shipped voice, read here directly): with ``tts_engine.weights``
set the server's own ``/v1/audio/speech`` speaks with the random Kyutai model, whose sound the
VAD need not take for speech."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from rtserve.codecs.pcm import float_to_int16
from rtserve.codecs.resample import resample
from rtserve.config import ModelPaths, ServerConfig
from rtserve.engines.cascade.model_paths import resolve_tts
from rtserve.engines.piper_voice import PiperModel
from tests.engines.kyutai_tts.tiny import TinyTTS
from tests.web.realtime.test_realtime_cascade import CHUNK, LOAD_TIMEOUT_S, QUESTION, STORYTELLER
from tests.web.realtime.test_realtime_cascade_kyutai_tts import tiny
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime.test_realtime_stream_asr import COMPLETED, DELTA, stt_weights
from tests.web.realtime.test_realtime_stream_asr import QUESTION as LONG_QUESTION
from tests.web.realtime_support import audio_of, b64_pcm16, pcm16_b64, running

pytestmark = pytest.mark.models

__all__ = ["stt_weights", "tiny"]  # the checkpoint fixtures of the STT and TTS cascade tests, reused

CONVERSATION_TIMEOUT_S = 120  # a bound for a hung test only; the turn itself takes seconds
AUDIO = ("response.output_audio.delta", "response.output_audio_transcript.delta")


def piper_pcm(text: str) -> np.ndarray:
    """``text`` spoken by the shipped Piper voice, as 24 kHz PCM16."""
    location = resolve_tts(ModelPaths())
    assert location.path is not None, "the Piper voice package is not installed"
    voice = PiperModel(location.path, cpu_threads=1)
    audio = np.concatenate(list(voice.chunks(text, 1.0)))
    return float_to_int16(resample(audio, voice.sample_rate, 24000))


async def test_kyutai_stt_and_tts_agent_hears_answers_and_is_cut_off(
    config: ServerConfig, stt_weights: Path, tiny: TinyTTS
) -> None:
    config.engine = "cascade"
    config.stt_engine = config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": 2})
    config.tts_engine = config.tts_engine.model_copy(
        update={"weights": str(tiny.folder), "voices": str(tiny.voices), "default_voice": "alice", "max_sessions": 1}
    )
    config.cascade = config.cascade.model_copy(update={"asr": "stt_engine", "tts": "tts_engine"})  # engines first
    request, interruption = piper_pcm(LONG_QUESTION), piper_pcm(QUESTION)
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=60)
        async with client.realtime.connect(model="cascade") as conn:
            reader = SdkReader(conn, timeout_s=60)
            await reader.until("session.created")
            await conn.session.update(session={"type": "realtime", "instructions": STORYTELLER})
            assert (await reader.until("session.updated"))["session"]["audio"]["input"]["turn_detection"][
                "type"
            ] == "server_vad"
            reply_arriving = asyncio.Event()

            async def microphone() -> None:
                """A live microphone at real time (the STT steps in real time): the request,
                silence until the reply is heard, the interruption, then silence (bounded)."""

                async def say(pcm: np.ndarray) -> None:
                    for start in range(0, len(pcm), CHUNK):
                        await conn.input_audio_buffer.append(audio=pcm16_b64(pcm[start : start + CHUNK]))
                        await asyncio.sleep(CHUNK / 24000)

                silence = np.zeros(CHUNK, np.int16)
                await say(np.concatenate([silence, request]))
                for _ in range(CONVERSATION_TIMEOUT_S * 24000 // CHUNK):
                    if reply_arriving.is_set():
                        break
                    await say(silence)
                await say(interruption)
                for _ in range(CONVERSATION_TIMEOUT_S * 24000 // CHUNK):
                    await say(silence)

            async def converse() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
                first = (await reader.until("response.created", limit=20000))["response"]["id"]
                item = (await reader.until("response.output_item.added"))["item"]["id"]
                delta = await reader.until("response.output_audio.delta", limit=20000)
                assert delta["response_id"] == first and b64_pcm16(delta["delta"]).size > 0
                reply_arriving.set()
                started = await reader.until("input_audio_buffer.speech_started", limit=20000)
                # What an OpenAI client does on speech_started: stop playback and truncate the
                # reply to what it played (here: everything it received).
                heard_ms = len(audio_of(reader.events)) * 1000 // 24000
                await conn.conversation.item.truncate(item_id=item, content_index=0, audio_end_ms=heard_ms)
                for _ in range(20000):
                    done = [e for e in reader.events if e["type"] == "response.done" and e["response"]["id"] == first]
                    truncated = [e for e in reader.events if e["type"] == "conversation.item.truncated"]
                    if done and truncated:
                        return started, done[0], truncated[0], heard_ms
                    await reader.next()
                raise AssertionError("the reply was neither finished nor truncated after the barge-in")

            speaking = asyncio.create_task(microphone())
            try:
                started, first_done, truncated, heard_ms = await asyncio.wait_for(converse(), CONVERSATION_TIMEOUT_S)
            finally:
                speaking.cancel()
                await asyncio.gather(speaking, return_exceptions=True)
    events: list[dict[str, Any]] = reader.events
    names = [e["type"] for e in events]
    first = first_done["response"]["id"]
    created = next(i for i, e in enumerate(events) if e["type"] == "response.created" and e["response"]["id"] == first)

    # The request: one turn, heard word by word; its deltas add up to its transcript.
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    turn = [e["delta"] for e in events if e["type"] == DELTA and e["item_id"] == committed["item_id"]]
    assert turn, "no word of the request was heard"
    completed = next(i for i, e in enumerate(events) if e["type"] == COMPLETED)
    assert events[completed]["item_id"] == committed["item_id"]
    assert "".join(turn) == events[completed]["transcript"]
    last_delta = max(i for i, e in enumerate(events) if e["type"] == DELTA and e["item_id"] == committed["item_id"])
    assert names.index("input_audio_buffer.speech_started") < last_delta < completed
    # The reply is created at the commit (as OpenAI's, the transcript may come later), but speaks
    # only once the LLM has the whole transcript to answer.
    spoken = next(i for i, e in enumerate(events) if e["type"] == AUDIO[0] and e["response_id"] == first)
    assert events.index(committed) < created < spoken and completed < spoken

    # The reply was spoken by the TTS engine, and the interruption came while it was.
    cut = events.index(started)
    assert audio_of([e for e in events[:cut] if e.get("response_id") == first]).size > 0
    assert started["item_id"] != committed["item_id"]
    # Nothing of the reply after speech_started: the server fences its stream off at once.
    assert not [e for e in events[cut:] if e.get("response_id") == first and e["type"] in AUDIO]
    assert cut < events.index(first_done)
    response = first_done["response"]
    assert (response["status"], response["status_details"]) == (
        "cancelled",
        {"type": "cancelled", "reason": "turn_detected"},
    )
    (output,) = response["output"]
    assert output["status"] == "incomplete"
    assert (truncated["item_id"], truncated["content_index"], truncated["audio_end_ms"]) == (output["id"], 0, heard_ms)
