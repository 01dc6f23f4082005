"""``WS /v1/realtime`` on the cascade hearing with the streaming STT (``cascade.asr: stt_engine``,
docs/engines.md#cascade-streaming-asr), driven by the official ``openai`` SDK: a spoken question
(the server's own TTS) goes in and its transcript comes back word by word as
``conversation.item.input_audio_transcription.delta`` events, then ``.completed``. The STT is a
tiny random Kyutai checkpoint, so its words are gibberish: the events, their order and their
sums are asserted, not the words. ``semantic_vad`` is accepted there and refused by an engine
without a turn model."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from openai.types.realtime import RealtimeAudioInputTurnDetectionParam, RealtimeSessionCreateRequestParam

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.errors import ENGINE_SLEEPING
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.sessions.engine_double import TestDoubleEngine
from tests.support import serve_app
from tests.web.realtime.test_realtime_cascade import CHUNK, LOAD_TIMEOUT_S, speech_pcm
from tests.web.realtime.test_realtime_cascade_items import audio_item
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import HANG_GUARD_S, pcm16_b64, running

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
QUESTION = "What is the capital of France? Tell me about its rivers and its bridges."


@pytest.fixture(scope="module")
def stt_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stt_checkpoint(tmp_path_factory.mktemp("stream_asr") / "weights").folder


@asynccontextmanager
async def _hearing_with_stt(
    config: ServerConfig, stt_weights: Path
) -> AsyncIterator[tuple[openai.AsyncOpenAI, np.ndarray]]:
    """A server whose cascade hears with the tiny STT, an SDK client of it, and ``QUESTION`` spoken."""
    config.engine = "cascade"
    config.stt_engine = config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": 2})
    config.cascade = config.cascade.model_copy(update={"asr": "stt_engine"})
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=60)
        yield client, await speech_pcm(client, QUESTION)


@pytest.mark.models
async def test_speech_is_transcribed_word_by_word_under_semantic_vad(config: ServerConfig, stt_weights: Path) -> None:
    async with _hearing_with_stt(config, stt_weights) as (client, question):
        silence = np.zeros(24000 * 3, dtype=np.int16)  # the longest pause semantic_vad waits (low: 2 s)
        spoken = np.concatenate([silence[:4800], question, silence])
        async with client.realtime.connect(model="cascade") as conn:
            reader = SdkReader(conn)
            await reader.next()
            detection: RealtimeAudioInputTurnDetectionParam = {
                "type": "semantic_vad",
                "eagerness": "low",
                "create_response": False,
            }
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": detection}}})
            updated = (await reader.until("session.updated"))["session"]
            assert updated["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
            for start in range(0, len(spoken), CHUNK):  # at real time: the STT steps in real time
                await conn.input_audio_buffer.append(audio=pcm16_b64(spoken[start : start + CHUNK]))
                await asyncio.sleep(CHUNK / 24000)
            completed = await asyncio.wait_for(reader.until(COMPLETED, limit=5000), 60)
    events: list[dict[str, Any]] = reader.events
    names = [e["type"] for e in events]
    for name in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"):
        assert name in names, name
    committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
    item_id = committed["item_id"]
    assert completed["item_id"] == item_id
    deltas = [e for e in events if e["type"] == DELTA]
    # The tiny model says a word now and then on speech; each one is a delta as it comes.
    assert deltas, "no word was heard"
    assert all(isinstance(e["delta"], str) and e["delta"].strip() for e in deltas)
    turn = [e["delta"] for e in deltas if e["item_id"] == item_id]
    # The deltas of the turn add up to its transcript, and all come before it.
    assert "".join(turn) == completed["transcript"]
    assert names.index(COMPLETED) > max(
        i for i, e in enumerate(events) if e["type"] == DELTA and e["item_id"] == item_id
    )


async def test_semantic_vad_is_refused_by_an_engine_without_a_turn_model(config: ServerConfig) -> None:
    engine = TestDoubleEngine(mode="turn", supports_server_vad=True, supports_semantic_vad=False)
    async with serve_app(build_app(config, engine=engine)) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=HANG_GUARD_S)
        async with client.realtime.connect(model="x") as conn:
            reader = SdkReader(conn)
            await reader.next()
            semantic: RealtimeAudioInputTurnDetectionParam = {"type": "semantic_vad", "eagerness": "high"}
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": semantic}}})
            refused = (await reader.until("error"))["error"]
            # The beta shape's top-level turn_detection, which rtserve still reads: not in the SDK's GA type.
            beta: RealtimeSessionCreateRequestParam = {"type": "realtime", "turn_detection": {"type": "server_vad"}}  # type: ignore[typeddict-unknown-key]
            await conn.session.update(session=beta)
            accepted = (await reader.until("session.updated"))["session"]
    assert (refused["code"], refused["param"]) == ("unsupported_turn_detection", "session.audio.input.turn_detection")
    assert accepted["audio"]["input"]["turn_detection"]["type"] == "server_vad"


@pytest.mark.models
async def test_a_manual_commit_gets_the_turns_words_without_waiting_the_models_delay_out(
    config: ServerConfig, stt_weights: Path
) -> None:
    """With no turn detection the client commits as it stops talking; no silence went by for the
    model's delay to pass in, so the stream is flushed (docs/engines.md#cascade-streaming-asr)
    and the turn's transcript still holds every word said before the commit."""
    async with _hearing_with_stt(config, stt_weights) as (client, question):
        async with client.realtime.connect(model="cascade") as conn:
            reader = SdkReader(conn)
            await reader.next()
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            await reader.until("session.updated")
            for start in range(0, len(question), CHUNK):  # at real time: the STT steps in real time
                await conn.input_audio_buffer.append(audio=pcm16_b64(question[start : start + CHUNK]))
                await asyncio.sleep(CHUNK / 24000)
            await conn.input_audio_buffer.commit()
            committed = await asyncio.wait_for(reader.until("input_audio_buffer.committed"), HANG_GUARD_S)
            completed = await asyncio.wait_for(reader.until(COMPLETED, limit=5000), 60)
    events: list[dict[str, Any]] = reader.events
    assert completed["item_id"] == committed["item_id"]
    turn = [e["delta"] for e in events if e["type"] == DELTA and e["item_id"] == committed["item_id"]]
    assert turn, "no word was heard"
    assert "".join(turn) == completed["transcript"]


@pytest.mark.models
async def test_created_items_audio_is_heard_by_the_streaming_stt(config: ServerConfig, stt_weights: Path) -> None:
    """No Whisper is loaded where the cascade hears with the STT: the ``input_audio`` of a
    ``conversation.item.create`` is heard by the STT, word for word as the transcription route
    hears the same samples (greedy decoding), and the server lists the STT, not Whisper. The STT
    is sleep mode's ASR stage (1): asleep, requests are refused; awake, it hears the same again."""
    config.enable_sleep_mode = True
    async with _hearing_with_stt(config, stt_weights) as (client, question):
        served = {model.id async for model in client.models.list()}
        added = await audio_item(client, question)
        wav = ("q.wav", _wav_24k(question))
        plain = await client.audio.transcriptions.create(model="whisper-1", file=wav)
        slept = await client.post("/omni/sleep", body={"stage_ids": [1]}, cast_to=object)
        with pytest.raises(openai.APIStatusError) as refused:
            await client.audio.transcriptions.create(model="whisper-1", file=wav)
        await client.post("/omni/wakeup", body={"stage_ids": [1]}, cast_to=object)
        woken = await client.audio.transcriptions.create(model="whisper-1", file=wav)
    assert isinstance(slept, dict) and slept["acks"][0]["stage"] == "stt_engine"
    assert (refused.value.status_code, refused.value.code) == (503, ENGINE_SLEEPING)
    assert woken.text == plain.text
    assert "kyutai-stt" in served and "whisper-tiny.en" not in served
    transcript = added["content"][0]["transcript"]
    assert transcript, "the tiny model said no word on the question"
    assert transcript == plain.text


def _wav_24k(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()
