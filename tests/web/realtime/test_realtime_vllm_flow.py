"""vLLM's realtime transcription flow (the Qwen3-Omni / vLLM-Omni realtime clients) on
``/v1/realtime``, over a raw ``websockets`` socket as those clients use it (issue 16):
``session.update`` with a flat ``model``, ``commit`` ``final: false`` on an empty buffer
to start, appends at the client's own ``sample_rate_hz``, ``commit`` ``final: true`` to end;
``transcription.delta`` / ``transcription.done`` back."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
import websockets

from rtserve.config import ServerConfig
from rtserve.engines.events import InputTranscript
from tests.web.realtime.test_realtime_openai_fidelity import engine_session, scripted
from tests.web.realtime_support import HANG_GUARD_S, pcm16_b64


async def next_of(ws: Any, kind: str, seen: list[dict]) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), HANG_GUARD_S))
        seen.append(event)
        if event["type"] == kind:
            return event


async def test_vllm_transcription_flow(config: ServerConfig) -> None:
    async with scripted(config) as (client, engine):
        url = str(client.base_url).replace("http://", "ws://") + "realtime"
        async with websockets.connect(url) as ws:
            seen: list[dict] = []
            await next_of(ws, "session.created", seen)
            await ws.send(json.dumps({"type": "session.update", "model": "Qwen/Qwen3-Omni-30B-A3B-Instruct"}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": False}))  # empty: starts
            session = await engine_session(engine)
            second = np.full(16000, 3000, np.int16)  # one second at the client's 16 kHz
            for start in range(0, len(second), 1600):
                await ws.send(
                    json.dumps(
                        {
                            "type": "input_audio_buffer.append",
                            "sample_rate_hz": 16000,
                            "audio": pcm16_b64(second[start : start + 1600]),
                        }
                    )
                )
            deadline = time.monotonic() + HANG_GUARD_S
            while sum(map(len, session.pushed)) < 20000:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            session.emit(InputTranscript("hel", final=False))
            session.emit(InputTranscript("lo", final=False))
            first = await next_of(ws, "transcription.delta", seen)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
            done = await next_of(ws, "transcription.done", seen)
    deltas = [e["delta"] for e in seen if e["type"] == "transcription.delta"]
    assert first["delta"] == "hel" and "".join(deltas) == "hello there" == done["text"]
    assert [e for e in seen if e["type"] == "error"] == []  # the empty final:false commit is no error
    assert not session.responses  # a transcription, not a conversation turn
    assert abs(sum(map(len, session.pushed)) - 24000) < 100  # 16 kHz resampled to the engine's 24 kHz
