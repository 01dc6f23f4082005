"""``--engine moshi`` served end to end: the real app on 127.0.0.1, Moshi's sphn Ogg-Opus
client on ``/api/chat``, the tiny random model behind the lockstep runtime."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.registry import create_engine
from tests.web.moshi_support import FRAME, MoshiClient, moshi_server, noise_signal


def _config(config: ServerConfig, weights: Path) -> ServerConfig:
    return config.model_copy(update={
        "engine": "moshi",
        "lockstep": config.lockstep.model_copy(update={"max_input_backlog_frames": 64}),
        "moshi_engine": config.moshi_engine.model_copy(update={
            "weights": str(weights), "batch_size": 2, "use_sampling": False}),
    })


async def test_api_chat_streams_agent_audio_and_text_from_the_moshi_engine(config: ServerConfig,
                                                                           weights: Path) -> None:
    config = _config(config, weights)
    registry = CollectorRegistry()
    engine = create_engine("moshi", config, registry)
    assert engine.capabilities.chunk_period_ms == 80 and engine.capabilities.max_sessions == 2
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        url = server.ws_url("/api/chat") + "?text_prompt=you%20are%20a%20helpful%20assistant&seed=3"
        async with http.ws_connect(url) as ws:
            client = MoshiClient(ws)
            await client.handshake()  # sent only after the persona prefill ran through the step
            await client.send_pcm(noise_signal(20, seed=4))
            audio = await client.receive_audio(12 * FRAME)
    assert audio.dtype == np.float32 and len(audio) >= 12 * FRAME
    # Random weights still speak: the decoded agent audio is not silence.
    assert float(np.sqrt(np.mean(audio[4 * FRAME:] ** 2))) > 1e-4
    assert client.audio_messages >= 12
    assert client.text, "the inner-monologue text stream sent nothing"
    assert server.metric("rtserve_moshi_frames_in_total", route="/api/chat") >= 12
