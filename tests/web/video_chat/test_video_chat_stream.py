"""``WS /v1/video/chat/stream`` over 127.0.0.1 with the ``websockets`` client (docs/video.md#video-chat-stream):
frames and a question in, the agent's text, speech and ``response.done`` out, on the cascade with a
tiny vision-language model whose input shows the frames' image tokens; every bound a typed error
(issue 37)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtserve.config import ServerConfig
from tests.tiny_vlm import TOKENS_PER_IMAGE, build_tiny_vlm, jpeg_bytes, png_bytes, recorded_inputs, vision_config
from tests.web.realtime_support import loopback_config, running, ws_url

LOAD_TIMEOUT_S = 300
ROUTE = "/v1/video/chat/stream"


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


async def _next(ws: Any, timeout_s: float = 120) -> dict[str, Any]:
    return dict(json.loads(await asyncio.wait_for(ws.recv(), timeout_s)))


async def _error(ws: Any) -> dict[str, Any]:
    event = await _next(ws)
    assert event["type"] == "error", event
    return dict(event["error"])


@pytest.mark.models
async def test_frames_and_a_question_get_a_spoken_answer_that_saw_them(
    config: ServerConfig, tiny_vlm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = vision_config(config, tiny_vlm)
    config.video_input.sample_fps = 30.0  # keep every frame sent back to back
    with recorded_inputs(monkeypatch) as seen:
        async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
            async with websockets.connect(ws_url(base, ROUTE), additional_headers={"x-session-id": "cam-1"}) as ws:
                assert await _next(ws) == {"type": "session.created", "session_id": "cam-1"}
                await ws.send(jpeg_bytes("red"))
                await asyncio.sleep(0.05)
                frame = base64.b64encode(png_bytes("green")).decode()
                await ws.send(json.dumps({"type": "frame", "image": frame}))
                await asyncio.sleep(0.05)
                await ws.send(json.dumps({"type": "text", "text": "what do you see", "max_output_tokens": 6}))
                kinds: list[str] = []
                while (event := await _next(ws))["type"] != "response.done":
                    kinds.append(event["type"])
                    if event["type"] == "response.audio.delta":
                        assert event["sample_rate_hz"] == 24000 and base64.b64decode(event["audio"])
                    assert event["type"] != "error", event
    assert event["status"] == "completed", event
    assert "response.text.delta" in kinds
    assert seen.image_tokens() == [2 * TOKENS_PER_IMAGE]


@pytest.mark.models
async def test_bad_frames_are_typed_errors_and_a_flood_closes(config: ServerConfig, tiny_vlm: Path) -> None:
    config = vision_config(config, tiny_vlm)
    config.video_input.max_image_bytes = 64 * 1024
    config.video_input.max_frames_per_s = 4
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        async with websockets.connect(ws_url(base, ROUTE)) as ws:
            created = await _next(ws)
            assert created["type"] == "session.created" and created["session_id"]
            await ws.send(b"GIF89a" + bytes(100))
            assert (await _error(ws))["code"] == "invalid_image"
            await asyncio.sleep(0.3)
            await ws.send(bytes(70 * 1024))  # over max_image_bytes, under twice it
            assert (await _error(ws))["code"] == "image_too_large"
            await asyncio.sleep(0.3)
            await ws.send(json.dumps({"type": "frame", "image": "!!not base64"}))
            assert (await _error(ws)) == {
                "code": "invalid_image",
                "message": "'image' is not valid base64",
                "param": "image",
            }
            await ws.send("{not json")
            assert (await _error(ws))["code"] == "invalid_json"
            await ws.send(json.dumps({"type": "text", "text": ""}))
            assert (await _error(ws))["param"] == "text"
            for _ in range(10):  # a burst over 4 frames a second
                await ws.send(jpeg_bytes(size=(32, 32)))
            assert (await _error(ws))["code"] == "frame_rate_exceeded"
            with pytest.raises(ConnectionClosed):
                while True:
                    await _next(ws, 10)
            assert ws.close_code == 1008


async def test_refused_before_the_handshake(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base:
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(ws_url(base, ROUTE)):
                pass
        assert refused.value.response.status_code == 400
        assert json.loads(refused.value.response.body)["error"]["code"] == "vision_unsupported"
