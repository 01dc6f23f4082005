"""``WS /v1/realtime/video`` spoken with ``websockets`` over 127.0.0.1 against the tiny Wan
engine: JSON events, one binary fMP4 chunk after each ``video.chunk_metadata``, chunks that
concatenate into a file PyAV plays at the asked frame count and rate, ping/pong, stop, and the
start and stall timeouts with small configured values (docs/serving.md#streaming-video-output)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import websockets

from rtserve.config import ServerConfig
from rtserve.errors import (
    GENERATION_STALLED,
    INTERACTION_UNSUPPORTED,
    INVALID_VALUE,
    START_TIMEOUT,
    UNSUPPORTED_FORMAT,
)
from tests.engines.diffusion.tiny_video_pipeline import write_tiny_wan
from tests.web.videos.video_support import HOLDING, decode_mp4, video_config, video_server

START = {"type": "session.start", "prompt": "sunrise over water", "format": "m4s", "width": 48, "height": 32}


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("realtime-video") / "tiny-wan")


def _cfg(config: ServerConfig, tiny_wan: Path, store: Path, **videos: object) -> ServerConfig:
    cfg = video_config(config, tiny_wan, store, **videos)
    return cfg.model_copy(update={"video_engine": cfg.video_engine.model_copy(update={"max_batch": 1})})


async def _event(ws: websockets.ClientConnection) -> dict[str, Any]:
    message = await ws.recv()
    assert isinstance(message, str), "expected a JSON event"
    event: dict[str, Any] = json.loads(message)
    return event


async def _send(ws: websockets.ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(json.dumps(event))


def _url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/realtime/video"


async def test_stream_concatenates_into_the_asked_video(config: ServerConfig, tiny_wan: Path, tmp_path: Path) -> None:
    async with video_server(_cfg(config, tiny_wan, tmp_path)) as base, websockets.connect(_url(base)) as ws:
        await _send(ws, {"type": "session.ping", "event_id": "p0"})  # answered before a start too
        assert await _event(ws) == {"type": "session.pong", "event_id": "p0"}
        await _send(ws, {**START, "num_frames": 9, "fps": 8, "num_inference_steps": 2, "seed": 5})
        started = await _event(ws)
        assert started["type"] == "video.start" and started["format"] == "m4s"
        assert started["config"]["num_frames"] == 9 and started["config"]["fps"] == 8
        chunks: list[bytes] = []
        while (event := await _event(ws))["type"] == "video.chunk_metadata":
            assert event["request_id"] == started["request_id"] and event["chunk_index"] == len(chunks)
            data = await ws.recv()
            assert isinstance(data, bytes) and len(data) == event["byte_length"]
            chunks.append(data)
        assert event == {
            "type": "session.done",
            "request_id": started["request_id"],
            "chunks": len(chunks),
            "cancelled": False,
        }
        await ws.wait_closed()
    assert chunks[0][4:8] == b"ftyp" and len(chunks) == 3  # a chunk per decoded segment (5, 4 frames), then the tail
    frames, rate, size, codec = decode_mp4(b"".join(chunks))
    assert (len(frames), rate, size, codec) == (9, 8.0, (48, 32), "h264")


async def test_stop_cancels_and_interaction_is_refused(config: ServerConfig, tiny_wan: Path, tmp_path: Path) -> None:
    async with video_server(_cfg(config, tiny_wan, tmp_path)) as base, websockets.connect(_url(base)) as ws:
        await _send(ws, {**START, **HOLDING})
        assert (await _event(ws))["type"] == "video.start"
        await _send(ws, {"type": "session.interaction", "interaction": {"event": {"prompt": "mist"}}})
        refused = await _event(ws)
        assert refused["type"] == "error" and refused["code"] == INTERACTION_UNSUPPORTED
        await _send(ws, {"type": "session.stop"})
        done = await _event(ws)
        assert done["type"] == "session.done" and done["cancelled"] is True and done["chunks"] == 0
        await ws.wait_closed()


async def test_no_start_in_time_is_an_error_then_close(config: ServerConfig, tiny_wan: Path, tmp_path: Path) -> None:
    async with video_server(_cfg(config, tiny_wan, tmp_path, start_timeout_s=0.3)) as base:
        async with websockets.connect(_url(base)) as ws:
            error = await _event(ws)
            assert error["type"] == "error" and error["code"] == START_TIMEOUT
            await ws.wait_closed()
            assert ws.close_code == 1008


async def test_a_request_without_progress_stalls(config: ServerConfig, tiny_wan: Path, tmp_path: Path) -> None:
    # One request per wave: a job holds the engine, so the streamed request waits without a step.
    cfg = _cfg(config, tiny_wan, tmp_path, stall_timeout_s=0.2)
    async with video_server(cfg) as base, aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/videos", json={"prompt": "a", **HOLDING}) as response:
            assert response.status == 200
        async with websockets.connect(_url(base)) as ws:
            await _send(ws, {**START, "num_inference_steps": 2, "num_frames": 5})
            assert (await _event(ws))["type"] == "video.start"
            error = await _event(ws)
            assert error["type"] == "error" and error["code"] == GENERATION_STALLED
            await ws.wait_closed()


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"format": "mp4"}, UNSUPPORTED_FORMAT, "format"),
        ({"num_inference_steps": 0}, INVALID_VALUE, "num_inference_steps"),
        ({"width": 50}, INVALID_VALUE, "width"),
    ],
)
async def test_a_bad_start_is_an_error_naming_the_field(
    config: ServerConfig, tiny_wan: Path, tmp_path: Path, fields: dict[str, Any], code: str, param: str
) -> None:
    async with video_server(_cfg(config, tiny_wan, tmp_path)) as base, websockets.connect(_url(base)) as ws:
        await ws.send(b"\x00")  # not an event: answered, the connection stays
        assert (await _event(ws))["type"] == "error"
        await _send(ws, {**START, **fields})
        error = await _event(ws)
        assert (error["type"], error["code"], error["param"]) == ("error", code, param)
        await ws.wait_closed()
