"""``WS /v1/audio/duplex``: JSON control + raw float32 PCM, over real sockets."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.lockstep import LockstepSessionEngine
from rtserve.engines.reference import LoopbackModel
from tests.web.moshi_support import FRAME, WAIT_S, best_lag, expect_close, moshi_config, moshi_server, noise_signal

DUPLEX = "/v1/audio/duplex"


async def next_json(ws: aiohttp.ClientWebSocketResponse) -> dict:
    """The next JSON message, skipping agent audio."""
    while True:
        message = await ws.receive(timeout=WAIT_S)
        if message.type is aiohttp.WSMsgType.TEXT:
            return message.json()
        assert message.type is aiohttp.WSMsgType.BINARY, message


async def test_open_ready_pcm_close_flushes_the_tail_then_done(config: ServerConfig) -> None:
    # No grace period: 'close' drains explicitly (tail stepped, the loopback's delayed answer read).
    config = moshi_config(config, delay_frames=1, backlog_ms=64 * 80)
    signal = noise_signal(3, seed=4)[: int(2.5 * FRAME)]  # two and a half frames
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open", "persona": "You are a helpful agent."})
            assert await next_json(ws) == {"type": "ready"}
            for start in range(0, len(signal), 1000):  # chunks unaligned to frames
                await ws.send_bytes(signal[start : start + 1000].astype("<f4").tobytes())
            await ws.send_json({"type": "close"})
            received: list[np.ndarray] = []
            while True:
                message = await ws.receive(timeout=WAIT_S)
                if message.type is aiohttp.WSMsgType.BINARY:
                    received.append(np.frombuffer(message.data, "<f4"))
                    continue
                assert message.type is aiohttp.WSMsgType.TEXT, message
                assert message.json() == {"type": "done"}
                break
            code, _ = await expect_close(ws)
    assert code == 1000
    assert all(len(chunk) == FRAME for chunk in received)
    output = np.concatenate(received)
    # Every sample echoed bit for bit, in order, none dropped: the engine framed the chunks
    # as they arrived, so frames may be padded with silence where a tick found a partial frame.
    assert np.all(signal != 0)
    np.testing.assert_array_equal(output[output != 0], signal)
    assert server.metric("rtserve_moshi_frames_in_total", route=DUPLEX) == 2.5


async def test_second_open_is_an_error_and_the_session_stays_usable(config: ServerConfig) -> None:
    async with moshi_server(moshi_config(config)) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open"})
            assert await next_json(ws) == {"type": "ready"}
            await ws.send_json({"type": "open"})
            assert await next_json(ws) == {
                "type": "error",
                "error": "session already open",
                "code": "session_already_open",
            }
            await ws.send_bytes(noise_signal(1).tobytes())
            await ws.send_json({"type": "close"})
            assert await next_json(ws) == {"type": "done"}


async def test_bad_messages_get_error_events_and_the_connection_stays_usable(config: ServerConfig) -> None:
    async with moshi_server(moshi_config(config)) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_bytes(noise_signal(1).tobytes())  # before open: ignored
            bad = {
                "{not json": "invalid_json",
                "[1, 2]": "invalid_message",
                '{"type": "dance"}': "unknown_type",
                '{"type": "open", "seed": "x"}': "invalid_message",
                '{"type": "open", "voice": "../../etc/passwd"}': "invalid_prompt",
            }
            for text, code in bad.items():
                await ws.send_str(text)
                event = await next_json(ws)
                assert (event["type"], event["code"]) == ("error", code), text
                assert "Traceback" not in event["error"]
            await ws.send_json({"type": "open"})
            assert await next_json(ws) == {"type": "ready"}
            await ws.send_bytes(b"\x00\x00\x80")  # not whole float32 samples
            assert (await next_json(ws))["code"] == "invalid_audio"
            await ws.send_bytes(np.array([0.1, np.nan], "<f4").tobytes())
            assert (await next_json(ws))["code"] == "invalid_audio"
            await ws.send_bytes(noise_signal(2).tobytes())
            await ws.send_json({"type": "close"})
            assert await next_json(ws) == {"type": "done"}
    assert server.metric("rtserve_moshi_frames_in_total", route=DUPLEX) == 2


async def test_voice_names_resolve_inside_the_voice_directory_only(config: ServerConfig, tmp_path: Path) -> None:
    (tmp_path / "NATM1.pt").write_bytes(b"voice")
    config = moshi_config(config).model_copy(
        update={"models": config.models.model_copy(update={"voice_prompt_dir": str(tmp_path)})}
    )
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open", "voice": "/etc/passwd"})
            assert (await next_json(ws))["code"] == "invalid_prompt"
            await ws.send_json({"type": "open", "voice": "NATM1"})
            assert await next_json(ws) == {"type": "ready"}


async def test_open_beyond_capacity_is_closed_with_1013(config: ServerConfig) -> None:
    async with moshi_server(moshi_config(config, batch_size=1)) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as first, http.ws_connect(server.ws_url(DUPLEX)) as second:
            await first.send_json({"type": "open"})
            assert await next_json(first) == {"type": "ready"}
            await second.send_json({"type": "open"})
            assert await expect_close(second) == (1013, "all conversation slots busy")


async def test_close_before_open_is_done_at_once(config: ServerConfig) -> None:
    async with moshi_server(moshi_config(config)) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "close"})
            assert await next_json(ws) == {"type": "done"}
            assert (await expect_close(ws))[0] == 1000


async def test_shutdown_closes_duplex_connections_with_1001(config: ServerConfig) -> None:
    async with aiohttp.ClientSession() as http:
        async with moshi_server(moshi_config(config)) as server:
            ws = await http.ws_connect(server.ws_url(DUPLEX))
            await ws.send_json({"type": "open"})
            assert await next_json(ws) == {"type": "ready"}
        assert await expect_close(ws) == (1001, "server shutting down")
    assert server.metric("rtserve_moshi_open_connections", route=DUPLEX) == 0


async def test_an_engine_at_another_rate_is_resampled_both_ways(config: ServerConfig) -> None:
    config = moshi_config(config, delay_frames=0, backlog_ms=64 * 80)
    registry = CollectorRegistry()
    model = LoopbackModel(batch_size=2, delay_frames=0, frame_size=1280, sample_rate=16_000)  # 80 ms at 16 kHz
    engine = LockstepSessionEngine("loopback16k", model, config, registry, supports_text_output=False)
    signal = noise_signal(20, seed=5)
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open"})
            assert await next_json(ws) == {"type": "ready"}
            await ws.send_bytes(signal.tobytes())
            await ws.send_json({"type": "close"})
            received = []
            while (message := await ws.receive(timeout=WAIT_S)).type is aiohttp.WSMsgType.BINARY:
                received.append(np.frombuffer(message.data, "<f4"))
            assert message.json() == {"type": "done"}
    output = np.concatenate(received)
    reference = signal  # band-limited to 4 kHz: survives 24k -> 16k -> 24k, tails flushed both ways
    _, score = best_lag(output, reference, max_lag=len(output) - len(reference))
    assert score > 0.95
    # 16 kHz frames of 1280 samples: 20 frames of 24 kHz input are 20 engine frames.
    assert server.metric("rtserve_moshi_frames_in_total", route=DUPLEX) == 20
