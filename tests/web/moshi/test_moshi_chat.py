"""``WS /api/chat`` driven by a sphn Ogg-Opus client (the Moshi framing) over real sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import numpy.typing as npt
import pytest
import sphn
from prometheus_client import CollectorRegistry

from rtserve.codecs.pcm import FloatArray
from rtserve.config import ServerConfig
from rtserve.engines.lockstep import LockstepSessionEngine
from rtserve.engines.reference import LoopbackModel
from rtserve.engines.registry import create_engine
from rtserve.engines.values import FrameOutput
from tests.web.moshi_support import (
    FRAME,
    WAIT_S,
    HeldTickClock,
    MoshiClient,
    RecordingEngine,
    best_lag,
    expect_close,
    held_loopback_engine,
    moshi_config,
    moshi_server,
    noise_signal,
)

CHAT = "/api/chat"
# Opus algorithmic delay along the path (client encoder, server decoder + resampler, server
# encoder, client decoder): well under one 80 ms frame, so a frame error cannot hide in it.
OPUS_DELAY_TOLERANCE = 1200  # samples (50 ms)


@pytest.mark.engine_clock
async def test_echo_comes_back_frame_aligned_after_the_loopback_delay(config: ServerConfig) -> None:
    delay_frames, frames = 2, 25
    config = moshi_config(config, delay_frames=delay_frames, backlog_ms=64 * 80)
    registry = CollectorRegistry()
    clock = HeldTickClock()
    engine = held_loopback_engine(config, registry, clock)
    signal = noise_signal(frames)
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            try:
                client = MoshiClient(ws)
                await client.handshake()
                await client.send_pcm(signal)
                # Queue the input before the engine's second tick (the first opened the slot).
                # (sphn's writer and the Opus decoder each hold back some audio until more comes.)
                await server.wait_metric("rtserve_moshi_frames_in_total", frames - 2, route=CHAT)
            finally:
                clock.release()
            output = await client.receive_audio((frames + delay_frames + 1) * FRAME)
    # The server's RFC 7845 reader drops the pre-skip sphn declares (3840 at 48 kHz = 80 ms,
    # more than libopus's real lookahead): the user audio it keeps starts there.
    kept = signal[client.pre_skip_24k : (frames - 2) * FRAME]
    lag, score = best_lag(output, kept, max_lag=(delay_frames + 5) * FRAME)
    assert score > 0.8, f"echo does not match the input (correlation {score:.2f})"
    expected = (1 + delay_frames) * FRAME  # the opening tick's silent frame, then the loopback delay
    assert expected <= lag < expected + OPUS_DELAY_TOLERANCE, (
        f"echo at {lag} samples; expected {expected} (1 silent frame + loopback delay)"
    )
    # One Ogg page per 80 ms engine frame, sent as each frame was produced.
    assert client.audio_messages >= frames + delay_frames
    assert all(len(chunk) == FRAME for chunk in client.audio[1:])


async def test_each_80ms_page_reaches_the_engine_on_arrival(config: ServerConfig) -> None:
    config = moshi_config(config)
    signal = noise_signal(12, seed=6)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(signal[:FRAME])  # all of it is sphn's declared pre-skip
            for page in range(1, 12):
                await client.send_pcm(signal[page * FRAME : (page + 1) * FRAME])
                # This page's audio is with the engine now (the next tick steps it), less only
                # the decoder's hold-back: no transport-side chunker waits for a whole frame.
                await server.wait_metric("rtserve_moshi_frames_in_total", page - 0.5, route=CHAT)


@pytest.mark.parametrize("inline_packets", [4, 64])
async def test_a_message_carrying_a_second_of_audio_reaches_the_engine_whole(
    config: ServerConfig, inline_packets: int
) -> None:
    # A client that batches pages: over moshi.inline_decode_packets they decode on the codec
    # executor (4), within it on the loop (64); either way every frame reaches the engine.
    config = moshi_config(config, backlog_ms=64 * 80, inline_decode_packets=inline_packets)
    signal = noise_signal(14, seed=7)
    writer = sphn.OpusStreamWriter(24_000)
    pages = b"".join(writer.append_pcm(signal[i * FRAME : (i + 1) * FRAME]) for i in range(14))
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            await MoshiClient(ws).handshake()
            await ws.send_bytes(b"\x01" + pages)
            await server.wait_metric("rtserve_moshi_frames_in_total", 12, route=CHAT)


async def test_capacity_plus_one_is_closed_with_1013_until_a_slot_frees(config: ServerConfig) -> None:
    config = moshi_config(config, batch_size=2)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        first = await http.ws_connect(server.ws_url(CHAT))
        second = await http.ws_connect(server.ws_url(CHAT))
        for ws in (first, second):
            await MoshiClient(ws).handshake()
        async with http.ws_connect(server.ws_url(CHAT)) as extra:
            code, reason = await expect_close(extra)
        assert (code, reason) == (1013, "all conversation slots busy")
        assert server.metric("rtserve_moshi_connections_total", route=CHAT, outcome="busy") == 1

        await first.close()
        await second.close()
        # Slots free once the engine thread released them; a new caller is admitted.
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while True:
            ws = await http.ws_connect(server.ws_url(CHAT))
            message = await ws.receive(timeout=WAIT_S)
            if message.type is aiohttp.WSMsgType.BINARY:
                assert message.data == b"\x00"
                await ws.close()
                break
            assert asyncio.get_running_loop().time() < deadline, "slot never freed"
            await asyncio.sleep(0.05)


async def test_malformed_ogg_closes_that_connection_only(config: ServerConfig) -> None:
    config = moshi_config(config, delay_frames=0, backlog_ms=64 * 80)
    first, second = noise_signal(10, seed=1), noise_signal(20, seed=2)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as good_ws, http.ws_connect(server.ws_url(CHAT)) as bad_ws:
            good, bad = MoshiClient(good_ws), MoshiClient(bad_ws)
            await good.handshake()
            await bad.handshake()
            await good.send_pcm(first)

            await bad_ws.send_bytes(b"\x01" + b"this is not an Ogg page" * 4)
            code, reason = await expect_close(bad_ws)
            assert code == 1007
            assert reason.startswith("invalid_ogg") and "Traceback" not in reason

            # The other conversation keeps streaming: what it sends now still echoes back.
            await good.send_pcm(second)
            reference = second[FRAME:-FRAME]
            for frames in range(len(second) // FRAME, 100, 5):
                output = await good.receive_audio(frames * FRAME)
                _lag, score = best_lag(output, reference, max_lag=len(output) - len(reference))
                if score > 0.8:
                    break
            else:
                raise AssertionError("the surviving connection's audio never echoed back")
    assert server.metric("rtserve_moshi_connections_total", route=CHAT, outcome="accepted") == 2


async def test_corrupted_page_after_a_valid_stream_start_is_refused(config: ServerConfig) -> None:
    config = moshi_config(config)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(2))
            page = bytearray(client._writer.append_pcm(noise_signal(1, seed=3)))
            page[-1] ^= 0xFF  # body no longer matches the page CRC
            await ws.send_bytes(b"\x01" + bytes(page))
            code, reason = await expect_close(ws)
    assert code == 1007 and "CRC" in reason


async def test_unknown_tags_and_text_messages_are_ignored(config: ServerConfig) -> None:
    config = moshi_config(config, delay_frames=0)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await ws.send_bytes(b"\x05whatever")
            await ws.send_bytes(b"")
            await ws.send_str("hello")
            await client.send_pcm(noise_signal(5))
            await client.receive_audio(4 * FRAME)
    assert server.metric("rtserve_moshi_frames_in_total", route=CHAT) >= 1


async def test_prompt_query_reaches_the_engine(config: ServerConfig, tmp_path: Path) -> None:
    (tmp_path / "NATF2.pt").write_bytes(b"voice")
    config = moshi_config(config).model_copy(
        update={"models": config.models.model_copy(update={"voice_prompt_dir": str(tmp_path)})}
    )
    registry = CollectorRegistry()
    engine = RecordingEngine(create_engine("loopback", config, registry))
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        query = {"text_prompt": "You are a wise teacher.", "voice_prompt": "NATF2", "seed": "42"}
        async with http.ws_connect(server.ws_url(CHAT), params=query) as ws:
            await MoshiClient(ws).handshake()
    prompt = engine.opened[0].prompt
    assert (prompt.text, prompt.voice, prompt.seed) == ("You are a wise teacher.", str(tmp_path / "NATF2.pt"), 42)


async def test_unsafe_or_unknown_voice_names_are_refused(config: ServerConfig, tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "NATF2.pt").write_bytes(b"voice")
    secret = tmp_path / "secret.pt"
    secret.write_bytes(b"not a voice")
    (voices / "escape.pt").symlink_to(secret)
    config = moshi_config(config).model_copy(
        update={"models": config.models.model_copy(update={"voice_prompt_dir": str(voices)})}
    )
    registry = CollectorRegistry()
    engine = RecordingEngine(create_engine("loopback", config, registry))
    refused = ["../secret.pt", "../secret", str(secret), "escape.pt", "sub/../../secret.pt", "NATM9", "..\\secret.pt"]
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        for name in refused:
            async with http.ws_connect(server.ws_url(CHAT), params={"voice_prompt": name}) as ws:
                code, reason = await expect_close(ws)
            assert code == 1008, name
            assert "voice" in reason and str(tmp_path) not in reason, reason
        async with http.ws_connect(server.ws_url(CHAT), params={"seed": "twelve"}) as ws:
            assert (await expect_close(ws)) == (1008, "seed must be an integer")
    assert engine.opened == []  # nothing refused ever reached the engine


async def test_oversized_message_is_closed_with_1009(config: ServerConfig) -> None:
    config = moshi_config(config)
    config = config.model_copy(update={"transport": config.transport.model_copy(update={"max_ws_message_bytes": 4096})})
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            await MoshiClient(ws).handshake()
            await ws.send_bytes(b"\x01" + bytes(8192))
            code, _ = await expect_close(ws)
    assert code == 1009


async def test_shutdown_closes_with_1001_and_releases_every_slot(config: ServerConfig) -> None:
    config = moshi_config(config)
    registry = CollectorRegistry()
    engine = RecordingEngine(create_engine("loopback", config, registry))
    async with aiohttp.ClientSession() as http:
        async with moshi_server(config, engine, registry) as server:
            sockets = [await http.ws_connect(server.ws_url(CHAT)) for _ in range(3)]
            for ws in sockets:
                await MoshiClient(ws).handshake()
            await MoshiClient(sockets[0]).send_pcm(noise_signal(3))
            # leaving the block runs the app's shutdown
        for ws in sockets:
            assert (await expect_close(ws)) == (1001, "server shutting down")
    assert engine.closed == 3
    assert server.metric("rtserve_moshi_open_connections", route=CHAT) == 0


class FlakyLoopback(LoopbackModel):
    """The real loopback model, with a switch that makes its batched step raise."""

    failing = False

    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        if self.failing:
            raise RuntimeError("injected step failure")
        return super().step(frames, live)


async def test_an_engine_failure_closes_with_1011_and_the_server_keeps_serving(config: ServerConfig) -> None:
    config = moshi_config(config, delay_frames=0)
    registry = CollectorRegistry()
    model = FlakyLoopback(batch_size=2, delay_frames=0)
    engine = LockstepSessionEngine("loopback", model, config, registry, supports_text_output=False)
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            await MoshiClient(ws).handshake()
            model.failing = True
            code, reason = await expect_close(ws)
        assert code == 1011 and "engine failed" in reason and "injected" not in reason
        model.failing = False
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(4))
            await client.receive_audio(3 * FRAME)


async def test_configured_ogg_limits_apply_to_chat_input(config: ServerConfig) -> None:
    """codecs.ogg_max_feed_audio_s bounds the audio one message may decode to."""
    config = moshi_config(config)
    config.codecs.ogg_max_feed_audio_s = 0.05  # less than one 80 ms packet
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(CHAT)) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(4))
            code, reason = await expect_close(ws)
    assert code == 1007 and reason.startswith("audio_limit_exceeded")
