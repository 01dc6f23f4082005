"""``--engine moshi`` served end to end: the real app on 127.0.0.1, Moshi's sphn Ogg-Opus
client on ``/api/chat``, the tiny random model behind the lockstep runtime."""

from __future__ import annotations

import aiohttp
import numpy as np
from aiohttp import WSCloseCode
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.registry import create_engine
from rtserve.engines.values import SlotSampling
from tests.web.moshi_support import FRAME, MoshiClient, RecordingEngine, expect_close, moshi_server, noise_signal


async def test_api_chat_streams_agent_audio_and_text_from_the_moshi_engine(moshi_config: ServerConfig) -> None:
    config = moshi_config
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
    assert float(np.sqrt(np.mean(audio[4 * FRAME :] ** 2))) > 1e-4
    assert client.audio_messages >= 12
    assert client.text, "the inner-monologue text stream sent nothing"
    assert server.metric("rtserve_moshi_frames_in_total", route="/api/chat") >= 12
    # Every page whose tick stepped user audio timed its server path (audio in -> page out).
    assert server.metric("rtserve_moshi_server_path_seconds_count", route="/api/chat") >= 8
    # ... and its two parts: up to its tick's due time (at most a period and a backlog's standing
    # audio) and from then until the frame was read (the tick and the way back).
    # The parts are on one clock: together they are the path less the egress (encode and write).
    path = server.metric("rtserve_moshi_server_path_seconds_sum", route="/api/chat")
    wait, back = (
        server.metric("rtserve_moshi_server_path_part_seconds_sum", route="/api/chat", part=part)
        for part in ("wait", "back")
    )
    assert wait > 0 and back > 0 and 0.5 * path < wait + back <= path


async def test_personaplex_query_parameters_reach_the_slot(moshi_config: ServerConfig) -> None:
    registry = CollectorRegistry()
    engine = RecordingEngine(create_engine("moshi", moshi_config, registry))
    query = "?text_prompt=&voice_prompt=&seed=-1&text_temperature=0.9&text_topk=20&audio_temperature=0.6&audio_topk=40"
    async with moshi_server(moshi_config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url("/api/chat") + query) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(8, seed=2))
            await client.receive_audio(4 * FRAME)
        async with http.ws_connect(server.ws_url("/api/chat") + "?seed=1&audio_temperature=-1") as ws:
            refused = await expect_close(ws)
    prompt = engine.opened[0].prompt
    assert prompt.seed is None  # -1: unseeded, as PersonaPlex takes it
    assert prompt.sampling == SlotSampling(text_temperature=0.9, text_top_k=20, audio_temperature=0.6, audio_top_k=40)
    assert refused[0] == WSCloseCode.POLICY_VIOLATION and "audio_temperature" in refused[1]
    assert len(engine.opened) == 1  # the refused one never took a slot


async def test_a_conversation_that_finds_no_kv_block_is_refused_as_busy(moshi_config: ServerConfig) -> None:
    """Paged int8 KV with a pool of one block (two engine slots): the second client gets 1013
    (busy), never a crash, while the first keeps talking past its block (it recycles its own)."""
    config = moshi_config.model_copy(
        update={
            "moshi_engine": moshi_config.moshi_engine.model_copy(
                update={"kv_cache": "paged_int8", "kv_block_frames": 8, "kv_pool_frames": 8}
            )
        }
    )
    registry = CollectorRegistry()
    engine = create_engine("moshi", config, registry)
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        url = server.ws_url("/api/chat") + "?seed=3"
        async with http.ws_connect(url) as first:
            client = MoshiClient(first)
            await client.handshake()
            await client.send_pcm(noise_signal(12, seed=4))
            audio = await client.receive_audio(10 * FRAME)  # past its first 8-frame block: it kept going
            async with http.ws_connect(url) as second:
                refused = await expect_close(second)
    assert refused[0] == WSCloseCode.TRY_AGAIN_LATER
    assert float(np.sqrt(np.mean(audio[4 * FRAME :] ** 2))) > 1e-4
