"""``--engine moshi`` on the duplex wires: ``/v1/audio/duplex`` (raw float32 PCM + JSON
control) and ``/v1/realtime?duplex=1`` (OpenAI Realtime events), real app on 127.0.0.1,
the tiny random model behind the lockstep runtime."""

from __future__ import annotations

from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.lockstep import LockstepSessionEngine
from rtserve.engines.moshi.engine import build_frame_model
from rtserve.engines.registry import create_engine
from tests.web.moshi_support import FRAME, WAIT_S, HeldTickClock, moshi_server, noise_signal
from tests.web.realtime_support import audio_of, pcm16_b64, receive_event, running, ws_url

DUPLEX = "/v1/audio/duplex"
# The tiny model's answer to a frame comes this many ticks later: its acoustic delay
# (1 frame) plus the Mimi decoder finishing a frame's samples in the next call.
TINY_OUTPUT_DELAY = 2


async def close_and_collect(ws: aiohttp.ClientWebSocketResponse) -> tuple[list[np.ndarray], list[str]]:
    """Send ``close``; every agent audio frame and text piece that arrives before ``done``."""
    await ws.send_json({"type": "close"})
    frames: list[np.ndarray] = []
    text: list[str] = []
    while True:
        message = await ws.receive(timeout=WAIT_S)
        if message.type is aiohttp.WSMsgType.BINARY:
            frames.append(np.frombuffer(message.data, "<f4"))
            continue
        assert message.type is aiohttp.WSMsgType.TEXT, message
        event = message.json()
        if event["type"] == "done":
            return frames, text
        assert event["type"] == "text", event
        text.append(event["text"])


async def test_audio_duplex_streams_agent_audio_and_text_and_close_drains(moshi_config: ServerConfig) -> None:
    frames_in = 16
    registry = CollectorRegistry()
    engine = create_engine("moshi", moshi_config, registry)
    async with moshi_server(moshi_config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open", "persona": "you are a helpful assistant", "seed": 3})
            assert (await ws.receive_json(timeout=WAIT_S)) == {"type": "ready"}  # after the persona prefill
            await ws.send_bytes(noise_signal(frames_in, seed=4).astype("<f4").tobytes())
            frames, text = await close_and_collect(ws)
    assert all(len(frame) == FRAME for frame in frames)
    # Every input frame was stepped and the model's answer to the last one read before 'done'.
    assert len(frames) >= frames_in + TINY_OUTPUT_DELAY
    audio = np.concatenate(frames)
    assert float(np.sqrt(np.mean(audio[4 * FRAME :] ** 2))) > 1e-4  # random weights still speak
    assert text, "the inner-monologue text stream sent nothing"
    assert server.metric("rtserve_moshi_frames_in_total", route=DUPLEX) == frames_in


@pytest.mark.engine_clock
async def test_close_waits_for_the_models_delayed_answer_to_the_last_frame(moshi_config: ServerConfig) -> None:
    frames_in = 6
    registry = CollectorRegistry()
    clock = HeldTickClock()
    model = build_frame_model(moshi_config)
    engine = LockstepSessionEngine("moshi", model, moshi_config, registry, supports_text_output=True, clock=clock)
    async with moshi_server(moshi_config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            try:
                await ws.send_json({"type": "open"})  # no prompt: live from the first tick
                assert (await ws.receive_json(timeout=WAIT_S)) == {"type": "ready"}
                await ws.send_bytes(noise_signal(frames_in, seed=5).astype("<f4").tobytes())
                # All input queued before the engine's second tick: it is stepped in the next ticks.
                await server.wait_metric("rtserve_moshi_frames_in_total", frames_in, route=DUPLEX)
            finally:
                clock.release()
            frames, _ = await close_and_collect(ws)
    # The opening tick's frame, one per input frame, then the answer's tail the model still owed.
    assert len(frames) >= 1 + frames_in + TINY_OUTPUT_DELAY


async def test_realtime_duplex_streams_agent_audio_and_text(moshi_config: ServerConfig) -> None:
    pcm16 = (noise_signal(12, seed=6) * 32767).astype("<i2")
    async with running(moshi_config) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            created = await receive_event(ws)
            assert created is not None and created["type"] == "session.created", created
            capabilities = created["session"]["capabilities"]
            assert (capabilities["engine"], capabilities["mode"]) == ("moshi", "lockstep")
            for start in range(0, len(pcm16), FRAME):
                chunk = pcm16_b64(pcm16[start : start + FRAME])
                await ws.send_json({"type": "input_audio_buffer.append", "audio": chunk})
            seen: list[dict[str, Any]] = []
            while len(audio_of(seen)) < 10 * FRAME:
                event = await receive_event(ws)
                assert event is not None, [e["type"] for e in seen][-20:]
                assert event["type"] != "error", event
                seen.append(event)
    audio = audio_of(seen).astype(np.float32) / 32768
    assert float(np.sqrt(np.mean(audio[4 * FRAME :] ** 2))) > 1e-4
    text = [
        e["delta"]
        for e in seen
        if e["type"] in ("response.output_audio_transcript.delta", "response.output_text.delta")
    ]
    assert text, "no text deltas from the model's inner monologue"
