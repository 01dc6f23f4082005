"""Clients that stop taking part, or decode too much, lose their Moshi connection; nobody else does.

Real sockets on 127.0.0.1 over the loopback engine, with short deadlines from the config.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.lockstep import LockstepSessionEngine
from rtserve.engines.reference import LoopbackModel
from tests.codecs.oggpages import amplifying_stream
from tests.web.moshi_support import (
    FRAME,
    WAIT_S,
    MoshiClient,
    Server,
    expect_close,
    moshi_config,
    moshi_server,
    noise_signal,
)

CHAT = "/api/chat"
DUPLEX = "/v1/audio/duplex"


async def _closed_by_server(ws: aiohttp.ClientWebSocketResponse) -> tuple[int | None, str]:
    """(close code, reason), reading past agent audio; fails if the server keeps the socket."""
    async with asyncio.timeout(WAIT_S):
        return await expect_close(ws)


async def _echo_keeps_coming(client: MoshiClient, seconds: float) -> None:
    """Stream audio in real time and read the echo for ``seconds``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    frame = 0
    while loop.time() < end:
        await client.send_pcm(noise_signal(1, seed=frame))
        frame += 1
        await client.receive_audio(sum(map(len, client.audio)) + 1)
        await asyncio.sleep(FRAME / 24_000)


async def _admitted_once_free(http: aiohttp.ClientSession, url: str) -> None:
    """A new conversation is admitted once the engine thread released the freed slot."""
    deadline = time.monotonic() + WAIT_S
    while True:
        async with http.ws_connect(url) as ws:
            if url.endswith(DUPLEX):
                await ws.send_json({"type": "open"})
            message = await ws.receive(timeout=WAIT_S)
            if message.type is not aiohttp.WSMsgType.CLOSE:
                assert message.data in (b"\x00", '{"type": "ready"}'), message
                return
        assert message.data == 1013 and time.monotonic() < deadline, "slot never freed"
        await asyncio.sleep(0.05)


async def test_a_silent_chat_client_is_closed_and_its_slot_freed_while_a_talking_one_stays(
    config: ServerConfig,
) -> None:
    config = moshi_config(config, batch_size=2, idle_timeout_s=0.5)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        silent = await http.ws_connect(server.ws_url(CHAT))
        talking = MoshiClient(await http.ws_connect(server.ws_url(CHAT)))
        await MoshiClient(silent).handshake()
        await talking.handshake()
        await silent.send_bytes(b"\x05not audio")  # messages other than audio do not hold the slot
        await _echo_keeps_coming(talking, 1.5)  # three idle timeouts of audio: still served
        code, reason = await _closed_by_server(silent)
        assert code == 1000 and reason == "idle timeout: no audio for 0.5 s"
        assert not talking.ws.closed
        await _admitted_once_free(http, server.ws_url(CHAT))
        await talking.ws.close()


async def test_a_duplex_socket_that_never_opens_is_closed(config: ServerConfig) -> None:
    config = moshi_config(config, open_timeout_s=0.3)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_bytes(np.zeros(FRAME, "<f4").tobytes())  # audio before 'open' does not count
            await ws.send_str("not json")
            started = time.monotonic()
            message = await ws.receive(timeout=WAIT_S)
            assert message.type is aiohttp.WSMsgType.TEXT and message.json()["code"] == "invalid_json"
            code, reason = await _closed_by_server(ws)
    assert code == 1000 and reason == "open timeout: no 'open' within 0.3 s"
    assert time.monotonic() - started < 2.0


async def test_an_open_duplex_conversation_without_audio_is_closed_and_its_slot_freed(config: ServerConfig) -> None:
    config = moshi_config(config, batch_size=1, idle_timeout_s=0.5)
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url(DUPLEX)) as ws:
            await ws.send_json({"type": "open"})
            code, reason = await _closed_by_server(ws)  # skips 'ready' and the agent's audio
        assert code == 1000 and reason == "idle timeout: no audio for 0.5 s"
        await _admitted_once_free(http, server.ws_url(DUPLEX))


class FastTickClock:
    """Engine time runs ~100x faster than real time: the loopback floods a reader that stops."""

    def __init__(self) -> None:
        self._now = time.monotonic()

    def monotonic(self) -> float:
        return self._now

    def sleep_until(self, deadline: float) -> None:
        time.sleep(0.0008)
        self._now = max(self._now, deadline)


async def _wait_stalled(server: Server, route: str) -> None:
    """Until the server's writes to a reader that stopped reading make no progress."""
    deadline = time.monotonic() + WAIT_S
    last = -1.0
    while (sent := server.metric("rtserve_moshi_frames_out_total", route=route)) != last:
        assert time.monotonic() < deadline, "the socket's send buffers never filled"
        last = sent
        await asyncio.sleep(0.3)


@pytest.mark.engine_clock
async def test_a_duplex_reader_that_stops_reading_is_dropped_and_its_slot_freed(config: ServerConfig) -> None:
    config = moshi_config(config, batch_size=1, send_timeout_s=1.0)
    registry = CollectorRegistry()
    model = LoopbackModel(config.lockstep.batch_size, config.reference.loopback_delay_frames)
    engine = LockstepSessionEngine(
        "loopback", model, config, registry, supports_text_output=False, clock=FastTickClock()
    )
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        ws = await http.ws_connect(server.ws_url(DUPLEX))
        await ws.send_json({"type": "open"})
        message = await ws.receive(timeout=WAIT_S)
        assert message.json() == {"type": "ready"}
        # From here the client never reads: the agent's audio fills every buffer on the way.
        await _wait_stalled(server, DUPLEX)
        with contextlib.suppress(ConnectionError):
            await ws.send_json({"type": "close"})  # the conversation ends; its output cannot be sent
        deadline = time.monotonic() + WAIT_S
        while server.metric("rtserve_moshi_open_connections", route=DUPLEX) > 0:
            assert time.monotonic() < deadline, "the stalled reader still holds its conversation"
            await asyncio.sleep(0.05)
        await _admitted_once_free(http, server.ws_url(DUPLEX))
        await ws.close()


async def test_small_pages_that_decode_to_long_audio_close_that_client_only(config: ServerConfig) -> None:
    config = moshi_config(config, batch_size=2)  # default decode rate: 2 s per second, 10 s of burst
    head, tags, *pages = amplifying_stream(pages=200, packets_per_page=20)  # 87-byte pages of 2.4 s each
    async with moshi_server(config) as server, aiohttp.ClientSession() as http:
        normal = MoshiClient(await http.ws_connect(server.ws_url(CHAT)))
        await normal.handshake()
        async with http.ws_connect(server.ws_url(CHAT)) as attacker:
            await MoshiClient(attacker).handshake()
            started = time.monotonic()
            await attacker.send_bytes(b"\x01" + head + tags)
            for page in pages:  # 480 s of audio, each page far below the per-message bound
                if attacker.closed:
                    break
                with contextlib.suppress(ConnectionError):
                    await attacker.send_bytes(b"\x01" + page)
            code, reason = await _closed_by_server(attacker)
        assert code == 1008 and reason.startswith("decode_rate_exceeded")
        assert time.monotonic() - started < 2.0
        await _echo_keeps_coming(normal, 1.0)
        await normal.ws.close()
