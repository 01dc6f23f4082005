"""``conversation.item.create`` with ``input_image`` parts (docs/video.md#input-image): on the
cascade with a vision LLM the image reaches the model as its image tokens; a model that cannot
see refuses it with ``vision_unsupported``; bad images are typed errors (issue 37)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import websockets

from rtserve.config import ServerConfig
from tests.tiny_vlm import (
    TOKENS_PER_IMAGE,
    build_tiny_vlm,
    data_url,
    jpeg_bytes,
    png_bytes,
    recorded_inputs,
    vision_config,
)
from tests.web.realtime_support import running, ws_url

LOAD_TIMEOUT_S = 300  # Whisper, Piper and the VAD load beside the tiny model


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


async def _until(ws: Any, wanted: str, timeout_s: float = 120) -> dict[str, Any]:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
        if event["type"] in (wanted, "error"):
            return dict(event)


def _image_item(*images: str, text: str = "what do you see") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "input_text", "text": text}]
    parts += [{"type": "input_image", "image_url": url} for url in images]
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": parts}}


@pytest.mark.models
async def test_input_image_reaches_the_vision_model(
    config: ServerConfig,
    tiny_vlm: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with recorded_inputs(monkeypatch) as seen:
        async with running(vision_config(config, tiny_vlm), ready_timeout_s=LOAD_TIMEOUT_S) as base:
            async with websockets.connect(ws_url(base)) as ws:
                await _until(ws, "session.created")
                await ws.send(json.dumps(_image_item(data_url(jpeg_bytes()), data_url(png_bytes(), "image/png"))))
                assert (await _until(ws, "conversation.item.done"))["type"] == "conversation.item.done"
                await ws.send(
                    json.dumps(
                        {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 4}}
                    )
                )
                done = await _until(ws, "response.done")
    assert done["type"] == "response.done" and done["response"]["status"] == "completed", done
    assert seen.image_tokens() == [2 * TOKENS_PER_IMAGE]
    assert seen.prefills[0][1][0] == 2  # both images in the pixel batch


BAD_IMAGES = [
    ("https://example.com/cat.jpg", "invalid_image"),  # the server fetches nothing
    ("data:image/jpeg;base64,not-base64!!", "invalid_image"),
    (data_url(b"GIF89a" + bytes(64), "image/png"), "invalid_image"),
    (data_url(jpeg_bytes()[:200]), "invalid_image"),  # truncated
    (data_url(bytes(3 * 1024 * 1024)), "image_too_large"),
    (data_url(png_bytes(size=(5000, 4000)), "image/png"), "image_too_large"),  # too many pixels: never decoded
]


@pytest.mark.models
async def test_bad_images_are_typed_errors_and_the_session_goes_on(
    config: ServerConfig,
    tiny_vlm: Path,
) -> None:
    async with running(vision_config(config, tiny_vlm), ready_timeout_s=LOAD_TIMEOUT_S) as base:
        async with websockets.connect(ws_url(base), max_size=None) as ws:
            await _until(ws, "session.created")
            for url, code in BAD_IMAGES:
                await ws.send(json.dumps(_image_item(url)))
                error = await _until(ws, "conversation.item.done")
                assert error["type"] == "error" and error["error"]["code"] == code, (url[:40], error)
                assert error["error"]["param"] == "item.content"
            await ws.send(json.dumps(_image_item(data_url(jpeg_bytes()))))
            assert (await _until(ws, "conversation.item.done"))["type"] == "conversation.item.done"


async def test_a_model_that_cannot_see_refuses_images(config: ServerConfig) -> None:
    config.engine = "loopback"
    async with running(config) as base, websockets.connect(ws_url(base)) as ws:
        await _until(ws, "session.created")
        await ws.send(json.dumps(_image_item(data_url(jpeg_bytes()))))
        error = await _until(ws, "conversation.item.done")
        assert error["type"] == "error" and error["error"]["code"] == "vision_unsupported", error
        assert error["error"]["param"] == "item.content"
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                }
            )
        )
        assert (await _until(ws, "conversation.item.done"))["type"] == "conversation.item.done"
