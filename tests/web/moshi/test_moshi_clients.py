"""Moshi and PersonaPlex clients as they are, against rtserve's defaults (issue 16).

* PersonaPlex's web UI always sends one of its stock voices (``voice_prompt=NATF2.pt``) and
  ``seed=-1``; on an engine without voice prompts it must connect with the default voice.
* On a turn engine (the embedded cascade) the Moshi routes run server-VAD turns through the
  session core, so a spoken turn gets a spoken answer: here with a scripted turn engine
  (the engine seam's test double, whose VAD events the test emits), and in
  ``test_moshi_cascade.py`` with the real models.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade.instructions import ANSWER_GUIDE
from rtserve.engines.events import SpeechStarted, SpeechStopped
from rtserve.engines.registry import create_engine
from tests.sessions.engine_double import TestDoubleEngine, TestDoubleEngineSession
from tests.web.moshi_support import (
    FRAME,
    WAIT_S,
    MoshiClient,
    RecordingEngine,
    expect_close,
    moshi_config,
    moshi_server,
    noise_signal,
)

CHAT = "/api/chat"
DUPLEX = "/v1/audio/duplex"


async def next_json(ws: aiohttp.ClientWebSocketResponse) -> dict:
    while True:
        message = await ws.receive(timeout=WAIT_S)
        if message.type is aiohttp.WSMsgType.TEXT:
            return message.json()
        assert message.type is aiohttp.WSMsgType.BINARY, message


# ---------------------------------------------------------------------------- PersonaPlex UI


@pytest.mark.parametrize("voice", ["NATF2.pt", "NATM0.pt", "VARF4.pt", "VARM3"])
async def test_personaplex_ui_stock_voice_connects_without_voice_prompts(config: ServerConfig, voice: str) -> None:
    config = moshi_config(config)
    assert config.models.voice_prompt_dir is None
    registry = CollectorRegistry()
    engine = RecordingEngine(create_engine("loopback", config, registry))
    query = {"text_prompt": "You enjoy having a good conversation.", "voice_prompt": voice, "seed": "-1"}
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT), params=query) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(4))
            await client.receive_audio(2 * FRAME)
    prompt = engine.opened[0].prompt
    assert (prompt.voice, prompt.seed, prompt.text) == (None, None, "You enjoy having a good conversation.")


async def test_non_stock_voice_without_voice_prompts_and_missing_stock_voice_are_refused(
    config: ServerConfig, tmp_path: Path
) -> None:
    async with moshi_server(moshi_config(config)) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT), params={"voice_prompt": "my_clone.wav"}) as ws:
            assert await expect_close(ws) == (1008, "voice prompts are not configured on this server")
    # A configured directory is the authority: a stock name it does not hold is refused.
    (tmp_path / "NATF2.pt").write_bytes(b"voice")
    configured = moshi_config(config).model_copy(
        update={"models": config.models.model_copy(update={"voice_prompt_dir": str(tmp_path)})}
    )
    async with moshi_server(configured) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT), params={"voice_prompt": "NATM1.pt"}) as ws:
            assert await expect_close(ws) == (1008, "unknown voice prompt 'NATM1.pt'")


async def test_duplex_open_accepts_stock_voice_and_unseeded_minus_one(config: ServerConfig) -> None:
    config = moshi_config(config)
    registry = CollectorRegistry()
    engine = RecordingEngine(create_engine("loopback", config, registry))
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open", "persona": "hi", "voice": "NATF2.pt", "seed": -1})
            assert await next_json(ws) == {"type": "ready"}
            await ws.send_json({"type": "open", "seed": -2})  # below -1 is still bad input
            error = await next_json(ws)
            assert error["type"] == "error" and error["code"] == "invalid_message" and "seed" in error["error"]
    assert (engine.opened[0].prompt.voice, engine.opened[0].prompt.seed) == (None, None)


# ---------------------------------------------------------------------------- turn engines


async def _turn_session(engine: TestDoubleEngine) -> TestDoubleEngineSession:
    deadline = time.monotonic() + WAIT_S
    while not engine.sessions:
        assert time.monotonic() < deadline, "no engine session was opened"
        await asyncio.sleep(0.01)
    return next(iter(engine.sessions.values()))


async def _until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_chat_on_a_turn_engine_answers_a_spoken_turn(config: ServerConfig) -> None:
    engine = TestDoubleEngine(mode="turn", supports_server_vad=True, input_sample_rate=16000)
    config = moshi_config(config)
    async with moshi_server(config, engine) as server, aiohttp.ClientSession() as http:
        query = {"text_prompt": "You are a pirate.", "voice_prompt": "NATF2.pt"}
        async with http.ws_connect(server.ws_url(CHAT), params=query) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            session = await _turn_session(engine)
            assert session.options.server_vad is not None  # the engine detects turns itself
            await client.send_pcm(noise_signal(3))
            await _until(lambda: session.pushed, "audio did not reach the engine")
            session.emit(SpeechStarted(0))
            session.emit(SpeechStopped(200))  # the engine's VAD ended the turn: commit, transcript, respond
            await _until(lambda: session.responses, "the spoken turn got no response")
            request = session.responses[0]
            assert [(m.role, m.content) for m in request.messages] == [
                ("system", f"You are a pirate. {ANSWER_GUIDE}"),  # who to be, then how to answer
                ("user", "hello there"),
            ]
            for _ in range(6):
                session.audio(request.response_id, 1920, text="Arr", value=0.25)
            session.finish(request.response_id)
            answer = await client.receive_audio(3 * FRAME)
    assert np.abs(answer).max() > 0.1  # the answer's audio, through Ogg-Opus both ways
    assert "Arr" in "".join(client.text)
    await _until(lambda: session.closed, "the session was not closed with the socket")


async def test_duplex_on_a_turn_engine_answers_a_spoken_turn(config: ServerConfig) -> None:
    engine = TestDoubleEngine(mode="turn", supports_server_vad=True)
    async with moshi_server(moshi_config(config), engine) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open", "persona": "Be brief."})
            assert await next_json(ws) == {"type": "ready"}
            session = await _turn_session(engine)
            await ws.send_bytes(noise_signal(2).astype("<f4").tobytes())
            await _until(lambda: session.pushed, "audio did not reach the engine")
            session.emit(SpeechStarted(0))
            session.emit(SpeechStopped(100))
            await _until(lambda: session.responses, "the spoken turn got no response")
            response_id = session.responses[0].response_id
            session.audio(response_id, 2400, text="Sure.", value=0.5)
            session.finish(response_id)
            audio = bytearray()
            texts: list[object] = []
            while len(audio) < 2400 * 4 or not texts:
                message = await ws.receive(timeout=WAIT_S)
                if message.type is aiohttp.WSMsgType.BINARY:
                    audio += message.data
                else:
                    texts.append(message.json())
            await ws.send_json({"type": "close"})
            assert await next_json(ws) == {"type": "done"}
    np.testing.assert_allclose(np.frombuffer(bytes(audio[: 2400 * 4]), "<f4"), 0.5, atol=1e-6)
    assert texts == [{"type": "text", "text": "Sure."}]


async def test_a_turn_conversation_the_server_ends_closes_the_socket(config: ServerConfig) -> None:
    engine = TestDoubleEngine(mode="turn", supports_server_vad=True)
    config = moshi_config(config)
    config.sessions.max_session_duration_s = 0.3
    config.sessions.reaper_interval_s = 0.05
    async with moshi_server(config, engine) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            await MoshiClient(ws).handshake()
            await MoshiClient(ws).send_pcm(noise_signal(1))
            assert await expect_close(ws) == (1000, "session ended: max_duration_reached")
