"""A camera on ``POST /v1/realtime/calls`` (docs/video.md#webrtc-video): an aiortc caller sends a
VP8 or H.264 video track beside its microphone; on the cascade with a vision LLM the sampled frames reach
the model as image tokens with the next user turn; a server whose LLM cannot see refuses the
offer with ``vision_unsupported`` before any session exists (issue 37)."""

from __future__ import annotations

import asyncio
import fractions
import json
import re
from pathlib import Path

import av
import numpy as np
import openai
import pytest
from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from rtserve.config import ServerConfig
from tests.tiny_vlm import TOKENS_PER_IMAGE, build_tiny_vlm, recorded_inputs, vision_config
from tests.web.realtime_support import HANG_GUARD_S, loopback_config, running
from tests.web.webrtc.test_webrtc_calls import sdk
from tests.web.webrtc_support import Caller, webrtc_config

LOAD_TIMEOUT_S = 300
FPS = 10


class Camera(MediaStreamTrack):
    """A paced 10 fps 320x240 track whose colour changes every frame."""

    kind = "video"

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self._start: float | None = None

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        self._start = self._start or loop.time()
        delay = self._start + self.sent / FPS - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pixels = np.full((240, 320, 3), (self.sent * 37) % 256, np.uint8)
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
        frame.pts, frame.time_base = self.sent, fractions.Fraction(1, FPS)
        self.sent += 1
        return frame


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.mark.models
@pytest.mark.parametrize("codec", ["video/VP8", "video/H264"])
async def test_camera_frames_reach_the_vision_model(
    config: ServerConfig, tiny_vlm: Path, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    config = webrtc_config(vision_config(config, tiny_vlm))
    config.video_input.sample_fps = 2.0
    with recorded_inputs(monkeypatch) as seen:
        async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
            caller = Caller()
            camera = Camera()
            sending = caller.pc.addTransceiver(camera, direction="sendonly")
            sending.setCodecPreferences(
                [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType == codec]
            )
            await caller.call(sdk(base))
            video = caller.pc.remoteDescription.sdp.split("m=video", 1)[1]
            assert set(re.findall(r"a=rtpmap:\d+ ([\w-]+)/90000", video)) - {"rtx"} == {codec.split("/")[1]}
            await caller.until("session.created")
            await caller.channel_open.wait()
            async with asyncio.timeout(HANG_GUARD_S):
                while camera.sent < 3 * FPS:  # 3 s of camera: ~6 frames kept at 2 fps, the window holds 4
                    await asyncio.sleep(0.1)
            assert caller.channel is not None
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what do you see"}]}
            caller.channel.send(json.dumps({"type": "conversation.item.create", "item": item}))
            caller.channel.send(
                json.dumps(
                    {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 4}}
                )
            )
            done = await caller.until("response.done", timeout_s=120)
            await caller.close()
    assert done["response"]["status"] == "completed", done
    assert seen.image_tokens() == [config.sessions.max_video_frames * TOKENS_PER_IMAGE]


async def test_a_video_offer_is_refused_when_the_model_cannot_see(config: ServerConfig) -> None:
    async with running(webrtc_config(loopback_config(config))) as base:
        caller = Caller()
        caller.pc.addTrack(Camera())
        with pytest.raises(openai.BadRequestError) as refused:
            await caller.call(sdk(base))
        await caller.close()
    assert refused.value.code == "vision_unsupported", refused.value.body
