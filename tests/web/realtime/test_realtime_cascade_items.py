"""``conversation.item.create`` with an ``input_audio`` part on the embedded cascade, through
the official ``openai`` SDK: the server transcribes the audio with its recognizer and the
item enters the conversation with that transcript (issue 16)."""

from __future__ import annotations

from typing import Any

import numpy as np
import openai
import pytest

from rtserve.config import ServerConfig
from tests.web.realtime.test_realtime_cascade import LOAD_TIMEOUT_S, QUESTION, heard_most_of, speech_pcm
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import pcm16_b64, running

pytestmark = pytest.mark.models


async def audio_item(client: openai.AsyncOpenAI, pcm: np.ndarray) -> dict[str, Any]:
    """The item a realtime session adds for a user message of ``pcm`` (24 kHz int16) as input_audio."""
    async with client.realtime.connect(model="cascade") as conn:
        reader = SdkReader(conn, timeout_s=120)
        await reader.next()
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm16_b64(pcm)}]}
        )
        added: dict[str, Any] = (await reader.until("conversation.item.added"))["item"]
    return added


async def test_input_audio_item_is_transcribed_into_the_conversation(config: ServerConfig) -> None:
    config.engine = "cascade"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=60)
        added = await audio_item(client, await speech_pcm(client, QUESTION))
    part = added["content"][0]
    assert part["type"] == "input_audio"
    assert heard_most_of(part["transcript"], QUESTION), part["transcript"]


async def test_vllm_transcription_flow_on_the_cascade(config: ServerConfig) -> None:
    import asyncio
    import json

    import websockets

    config.engine = "cascade"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=60)
        question = await speech_pcm(client, QUESTION)
        async with websockets.connect(base.replace("http://", "ws://") + "/v1/realtime") as ws:
            await ws.send(json.dumps({"type": "session.update", "model": "whisper"}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": False}))
            for start in range(0, len(question), 4800):
                await ws.send(
                    json.dumps(
                        {"type": "input_audio_buffer.append", "audio": pcm16_b64(question[start : start + 4800])}
                    )
                )
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                assert event["type"] != "error", event
                if event["type"] == "transcription.done":
                    break
    assert heard_most_of(event["text"], QUESTION), event["text"]
