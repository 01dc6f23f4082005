"""The voice page's camera in headless Chromium (docs/video.md#webrtc-video): Chromium's fake
camera and microphone, a WebRTC call with the camera switched on, a small self-view; the frames
reach the tiny vision-language model as image tokens with the user's turn; the switch turns the
camera off during the call; a server whose model cannot see says so (issue 37)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rtserve.config import ServerConfig
from tests.tiny_vlm import TOKENS_PER_IMAGE, build_tiny_vlm, recorded_inputs, vision_config
from tests.web.browser_support import chromium, console_errors, needs_chromium, until, write_voice_wav
from tests.web.realtime_support import loopback_config, running
from tests.web.webrtc_support import webrtc_config

pytestmark = [needs_chromium, pytest.mark.slow]

LOAD_TIMEOUT_S = 300
ANSWER_TIMEOUT_S = 120


async def _open(context, base: str):
    page = await context.new_page()
    errors = console_errors(page)
    await page.goto(base + "/")
    await page.select_option("select[name=transport]", "webrtc")
    await page.select_option("select[name=turn_detection]", "none")  # the test sends the turn
    await page.uncheck("input[name=echo_cancellation]")
    await page.check("#camera")
    await page.click("#connect")
    return page, errors


@pytest.mark.models
async def test_camera_frames_reach_the_model_with_the_turn(
    config: ServerConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = webrtc_config(vision_config(config, build_tiny_vlm(tmp_path / "vlm")))
    config.video_input.sample_fps = 2.0
    with recorded_inputs(monkeypatch) as seen:
        async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
            async with chromium(write_voice_wav(tmp_path / "voice.wav")) as context:
                page, errors = await _open(context, base)
                await until(page, "rtservePage.state === 'connected' && rtservePage.cameraOn", what="the camera on")
                assert await page.is_visible("#self-view")
                assert await page.evaluate("document.querySelector('#self-view').srcObject.getVideoTracks().length")
                await asyncio.sleep(3.0)  # ~6 frames kept at 2 fps; the window holds the newest 4
                await page.click("#send-turn")
                async with asyncio.timeout(ANSWER_TIMEOUT_S):
                    while not seen.prefills:
                        await asyncio.sleep(0.1)
                assert seen.image_tokens() == [config.sessions.max_video_frames * TOKENS_PER_IMAGE]

                await page.uncheck("#camera")  # the call sends no track from now on; the self-view goes
                await until(page, "!rtservePage.cameraOn", what="the camera off")
                assert not await page.is_visible("#self-view")
                assert errors() == []


async def test_the_page_says_when_the_model_cannot_see(config: ServerConfig, tmp_path: Path) -> None:
    async with running(webrtc_config(loopback_config(config))) as base:
        async with chromium(write_voice_wav(tmp_path / "voice.wav")) as context:
            page, _ = await _open(context, base)
            notice = await until(page, "rtservePage.notice", what="a notice")
            assert notice["kind"] == "error" and "cannot see" in notice["text"], notice
            assert await page.evaluate("rtservePage.state") == "failed"
            assert not await page.is_visible("#self-view")
