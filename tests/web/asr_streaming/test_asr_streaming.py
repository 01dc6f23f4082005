"""``WS /api/asr-streaming`` spoken with ``msgpack`` + ``websockets`` over 127.0.0.1, as Kyutai's
clients speak it, against the tiny Kyutai STT engine (docs/serving.md#asr-streaming)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets

from rtserve.app import build_app
from rtserve.config import ServerConfig
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.support import serve_app

FRAME = 1920
KEY = "sekret"


@pytest.fixture(scope="module")
def stt_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stt_checkpoint(tmp_path_factory.mktemp("asr_streaming") / "weights").folder


def _config(config: ServerConfig, stt_weights: Path, idle_timeout_s: float) -> ServerConfig:
    return config.model_copy(
        update={
            "engine": "loopback",
            "api_key": KEY,
            "stt_engine": config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": 2}),
            "asr_streaming": config.asr_streaming.model_copy(
                update={"max_message_bytes": 64 * 1024, "max_pending_markers": 4, "idle_timeout_s": idle_timeout_s}
            ),
        }
    )


@pytest.fixture
async def url(config: ServerConfig, stt_weights: Path) -> AsyncIterator[str]:
    async with serve_app(build_app(_config(config, stt_weights, 30.0))) as base:
        yield base.replace("http://", "ws://") + "/api/asr-streaming"


def _pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_single_float=True)
    return packed


async def _connect(url: str) -> websockets.ClientConnection:
    for _ in range(100):  # the engine loads in the background: refused until it serves
        ws = await websockets.connect(url, additional_headers={"kyutai-api-key": KEY})
        first = msgpack.unpackb(await ws.recv())
        if first["type"] == "Ready":
            return ws
        assert first == {"type": "Error", "message": first["message"], "code": "engine_unavailable"}
        await ws.close()
        await asyncio.sleep(0.1)
    raise AssertionError("the engine never became ready")


async def test_audio_and_a_marker_come_back_as_steps_words_and_the_marker_last(url: str) -> None:
    ws = await _connect(url)
    rng = np.random.default_rng(0)
    audio = (0.3 * rng.standard_normal(40 * FRAME)).astype(np.float32)
    for start in range(0, audio.size, 1000):  # pieces that are not whole frames
        await ws.send(_pack({"type": "Audio", "pcm": audio[start : start + 1000].tolist()}))
    await ws.send(_pack({"type": "Marker", "id": 42}))
    for _ in range(20):  # Kyutai's clients keep sending silence until the marker comes back
        await ws.send(_pack({"type": "Audio", "pcm": [0.0] * FRAME}))
    messages = []
    while True:
        message = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 30))
        messages.append(message)
        if message["type"] == "Marker":
            break
    await ws.close()
    assert messages[-1] == {"type": "Marker", "id": 42}
    steps = [m for m in messages if m["type"] == "Step"]
    # Every frame sent before the marker was stepped, plus the model's delay (0.5 s + 1 frame).
    assert len(steps) >= 40 + math.ceil(0.5 * 12.5) + 1 - math.ceil(0.5 * 12.5)
    assert [s["step_idx"] for s in steps] == sorted({s["step_idx"] for s in steps})
    assert all(len(s["prs"]) == 3 and all(0.0 <= p <= 1.0 for p in s["prs"]) for s in steps)
    assert all(isinstance(s["buffered_pcm"], int) and s["buffered_pcm"] >= 0 for s in steps)
    words = [m for m in messages if m["type"] in ("Word", "EndWord")]
    for word in words:
        if word["type"] == "Word":
            assert isinstance(word["text"], str) and word["text"] and word["start_time"] >= 0.0
        else:
            assert word["stop_time"] >= 0.0
    assert not (words and words[0]["type"] == "EndWord"), "an EndWord before any Word"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\xc1not msgpack", "invalid_msgpack"),
        (_pack({"type": "Audio", "pcm": "loud"}), "invalid_message"),
        (_pack({"type": "Audio", "pcm": [0.0, "0.5"]}), "invalid_message"),  # a number as text is no sample
        (_pack({"type": "Audio", "pcm": [[0.0], [0.5, 1.0]]}), "invalid_message"),
        (_pack({"type": "Audio", "pcm": [0.0, float("nan")]}), "invalid_audio"),
        (_pack({"type": "Marker", "id": "seven"}), "invalid_message"),
        (_pack({"type": "Shout"}), "unknown_type"),
        (None, "too_many_markers"),
    ],
)
async def test_bad_input_gets_a_typed_error_then_the_close(url: str, payload: bytes | None, code: str) -> None:
    ws = await _connect(url)
    if payload is None:  # a marker flood
        for marker in range(5):
            await ws.send(_pack({"type": "Marker", "id": marker}))
    else:
        await ws.send(payload)
    error = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))
    assert error["type"] == "Error" and error["code"] == code and error["message"]
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 10)
    # Other streams are not affected: a new one is served.
    other = await _connect(url)
    await other.close()


async def test_an_oversized_message_is_refused_with_1009(url: str) -> None:
    """aiohttp refuses a message over ``max_message_bytes`` from its header, before reading it,
    and closes at once: the close code is the answer (no ``Error`` can go out first)."""
    ws = await _connect(url)
    await ws.send(_pack({"type": "Audio", "pcm": [0.0] * 20000}))
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    other = await _connect(url)
    await other.close()


async def test_an_idle_client_is_closed_with_a_typed_error(config: ServerConfig, stt_weights: Path) -> None:
    async with serve_app(build_app(_config(config, stt_weights, 1.0))) as base:
        ws = await _connect(base.replace("http://", "ws://") + "/api/asr-streaming")
        messages = []
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                messages.append(msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10)))
    assert messages[-1]["type"] == "Error" and messages[-1]["code"] == "session_idle_timeout"


async def test_moshi_server_key_forms_are_accepted_and_a_missing_key_refused(url: str) -> None:
    async with websockets.connect(url + "?auth_id=" + KEY) as ws:
        assert msgpack.unpackb(await ws.recv())["type"] in ("Ready", "Error")
    async with websockets.connect(url) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001


async def test_a_server_with_no_speech_to_text_answers_404_before_the_handshake(config: ServerConfig) -> None:
    config = config.model_copy(update={"engine": "loopback", "api_key": KEY})  # no STT, no ASR
    async with serve_app(build_app(config)) as base:
        url = base.replace("http://", "ws://") + "/api/asr-streaming"
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers={"kyutai-api-key": KEY})
    response = refused.value.response
    assert response.status_code == 404
    assert json.loads(response.body or b"{}")["error"]["code"] == "asr_streaming_unavailable"


@pytest.mark.parametrize("kv_cache", ["paged_int8", "paged_int4"])
async def test_paged_kv_serves_streams_and_refuses_one_that_finds_no_free_block(
    config: ServerConfig, stt_weights: Path, kv_cache: str
) -> None:
    """``stt_engine.kv_cache: paged_int8`` (or 4-bit) with a pool of one block: the first stream
    holds it and is transcribed; a second stream is refused with a typed error, and the first goes on."""
    paged = _config(config, stt_weights, 30.0)
    paged.stt_engine = paged.stt_engine.model_copy(
        update={"kv_cache": kv_cache, "kv_block_frames": 8, "kv_pool_frames": 8}
    )
    async with serve_app(build_app(paged)) as base:
        url = base.replace("http://", "ws://") + "/api/asr-streaming"
        first = await _connect(url)
        second = await websockets.connect(url, additional_headers={"kyutai-api-key": KEY})
        messages = [msgpack.unpackb(await asyncio.wait_for(second.recv(), 30))]
        if messages[0]["type"] == "Ready":  # the refusal comes once the slot is opened on the engine thread
            await second.send(_pack({"type": "Audio", "pcm": [0.0] * FRAME}))
            messages.append(msgpack.unpackb(await asyncio.wait_for(second.recv(), 30)))
        assert messages[-1]["type"] == "Error" and messages[-1]["code"] == "resource_exhausted", messages
        await second.close()
        rng = np.random.default_rng(1)
        for _ in range(12):
            await first.send(_pack({"type": "Audio", "pcm": (0.3 * rng.standard_normal(FRAME)).tolist()}))
        await first.send(_pack({"type": "Marker", "id": 7}))
        for _ in range(20):
            await first.send(_pack({"type": "Audio", "pcm": [0.0] * FRAME}))
        while (message := msgpack.unpackb(await asyncio.wait_for(first.recv(), 30)))["type"] != "Marker":
            assert message["type"] in ("Step", "Word", "EndWord"), message
        assert message == {"type": "Marker", "id": 7}
        await first.close()
