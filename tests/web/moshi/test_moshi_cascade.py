"""``WS /api/chat`` on the embedded default engine (what ``make serve`` runs), driven as
Moshi's own clients drive it (sphn Ogg-Opus both ways): a spoken question, then silence,
gets a spoken answer and its text, with no turn events on the wire (issue 16)."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import openai
import pytest
import sphn

from rtserve.config import ServerConfig
from tests.web.moshi_support import FRAME, RATE, MoshiClient
from tests.web.realtime.test_realtime_cascade import LOAD_TIMEOUT_S, QUESTION, speech_pcm
from tests.web.realtime_support import running

pytestmark = pytest.mark.models

ANSWER_TIMEOUT_S = 180  # real models on a loaded 2-core CPU
ANSWER_SAMPLES = RATE // 2  # half a second of agent audio is an answer, not a glitch


async def _agent_audio(ws: aiohttp.ClientWebSocketResponse, moshi: MoshiClient, samples: int) -> np.ndarray:
    """``MoshiClient.receive_audio`` without its per-message timeout: a turn engine is silent
    until the turn ends and the answer is ready."""
    reader = sphn.OpusStreamReader(RATE)
    audio: list[np.ndarray] = []
    while sum(map(len, audio)) < samples:
        message = await ws.receive()
        assert message.type is aiohttp.WSMsgType.BINARY, message
        if message.data[0] == 1:
            pcm = reader.append_bytes(message.data[1:])
            if pcm is not None and len(pcm):
                audio.append(pcm)
        elif message.data[0] == 2:
            moshi.text.append(message.data[1:].decode("utf-8", "replace"))
    return np.concatenate(audio)


async def test_spoken_question_on_api_chat_gets_a_spoken_answer(config: ServerConfig) -> None:
    config.engine = "cascade"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base, aiohttp.ClientSession() as http:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=60)
        question = (await speech_pcm(client, QUESTION)).astype(np.float32) / 32768
        silence = np.zeros(RATE, np.float32)  # lets server VAD see the end of the turn
        spoken = np.concatenate([silence[: RATE // 4], question, silence, silence])
        url = base.replace("http://", "ws://") + "/api/chat"
        async with http.ws_connect(url, params={"voice_prompt": "NATF2.pt", "seed": "-1"}) as ws:
            moshi = MoshiClient(ws)
            await moshi.handshake()

            async def speak() -> None:  # at real time, as a microphone does
                for start in range(0, len(spoken), FRAME):
                    await moshi.send_pcm(spoken[start : start + FRAME])
                    await asyncio.sleep(FRAME / RATE)
                while True:  # keep the microphone open (silence) while the answer plays
                    await moshi.send_pcm(silence[:FRAME])
                    await asyncio.sleep(FRAME / RATE)

            speaking = asyncio.create_task(speak())
            try:
                answer = await asyncio.wait_for(_agent_audio(ws, moshi, ANSWER_SAMPLES), ANSWER_TIMEOUT_S)
            finally:
                speaking.cancel()
                await asyncio.gather(speaking, return_exceptions=True)
    assert np.sqrt(np.mean(answer**2)) > 0.01  # speech, not silence
    assert "".join(moshi.text).strip()  # the answer's words ride along as 0x02 text
