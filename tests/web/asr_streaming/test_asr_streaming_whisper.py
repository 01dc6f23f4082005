"""``WS /api/asr-streaming`` on the embedded default engine (no Kyutai STT configured): the
cascade's Whisper tiny.en behind the VAD, spoken to with ``msgpack`` + ``websockets`` over
127.0.0.1 as Kyutai's clients speak it (docs/serving.md#asr-streaming)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgpack
import numpy as np
import pytest
import websockets

from rtserve.config import ServerConfig
from tests.engines.cascade.cascade_support import heard_most_of
from tests.web.realtime_support import running

pytestmark = pytest.mark.models

SENTENCE = "What is the capital of France?"
FRAME = 1920  # 80 ms at 24 kHz
LOAD_TIMEOUT_S = 300
TALK_TIMEOUT_S = 240  # real models on a loaded 2-core CPU: only a hung test should hit it
LEAD_S = 0.5
MARKER = 42


async def _speech(base: str, text: str) -> np.ndarray:
    """``text`` spoken by the server's own TTS, 24 kHz float."""
    body = {"model": "piper-joe", "voice": "joe", "input": text, "response_format": "pcm"}
    async with aiohttp.ClientSession() as http, http.post(f"{base}/v1/audio/speech", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return np.frombuffer(await resp.read(), dtype="<i2").astype(np.float32) / 32768


def _pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_single_float=True)
    return packed


async def _talk(url: str, audio: np.ndarray) -> list[dict[str, Any]]:
    """Send ``audio`` in 80 ms messages, then the marker, then silence until the marker is back
    (as Kyutai's clients flush); every server message after ``Ready``."""
    async with websockets.connect(url) as ws:
        assert msgpack.unpackb(await ws.recv()) == {"type": "Ready"}
        received: list[dict[str, Any]] = []
        marked = asyncio.Event()

        async def send() -> None:
            for start in range(0, audio.size, FRAME):
                await ws.send(_pack({"type": "Audio", "pcm": audio[start : start + FRAME].tolist()}))
                await asyncio.sleep(0.02)
            await ws.send(_pack({"type": "Marker", "id": MARKER}))
            while not marked.is_set():
                await ws.send(_pack({"type": "Audio", "pcm": [0.0] * FRAME}))
                await asyncio.sleep(0.08)

        sender = asyncio.create_task(send())
        try:
            while not marked.is_set():
                received.append(msgpack.unpackb(await ws.recv()))
                if received[-1] == {"type": "Marker", "id": MARKER}:
                    marked.set()
        finally:
            sender.cancel()
        return received


async def test_a_spoken_sentence_comes_back_as_words_then_the_marker(config: ServerConfig) -> None:
    config.engine = "cascade"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        speech = await _speech(base, SENTENCE)
        # The marker follows the last word at once: it must wait for the utterance to end
        # (the silence sent after it) and be transcribed.
        speech = speech[: np.flatnonzero(np.abs(speech) > 0.01)[-1] + 1]  # Piper's trailing silence cut off
        audio = np.concatenate([np.zeros(int(24_000 * LEAD_S), np.float32), speech])
        audio = np.concatenate([audio, np.zeros(-audio.size % FRAME, np.float32)])
        url = base.replace("http://", "ws://") + "/api/asr-streaming"
        received = await asyncio.wait_for(_talk(url, audio), TALK_TIMEOUT_S)

    kinds = [message["type"] for message in received]
    assert kinds[-1] == "Marker" and kinds.count("Marker") == 1
    steps = [message for message in received if message["type"] == "Step"]
    assert [step["step_idx"] for step in steps] == list(range(1, len(steps) + 1))
    assert len(steps) >= audio.size // FRAME + 500 // 80  # each frame before the marker, and the pause ending it
    assert all(len(step["prs"]) == 1 and 0.0 <= step["prs"][0] <= 1.0 for step in steps)
    assert steps[0]["prs"][0] > 0.5  # the lead-in silence: a pause
    assert min(step["prs"][0] for step in steps) < 0.5  # the sentence: speech

    words = [message for message in received if message["type"] == "Word"]
    assert heard_most_of(" ".join(word["text"] for word in words), SENTENCE), words
    word_kinds = [kind for kind in kinds if kind in ("Word", "EndWord")]
    assert word_kinds == ["Word", "EndWord"] * len(words)  # each word closed before the next
    timed = [message for message in received if message["type"] in ("Word", "EndWord")]
    times: list[float] = [
        message["start_time"] if "start_time" in message else message["stop_time"] for message in timed
    ]
    assert times == sorted(times)
    spoken_end_s = LEAD_S + speech.size / 24_000
    assert times[0] >= LEAD_S - 0.4 and times[-1] <= spoken_end_s + 0.4, times
