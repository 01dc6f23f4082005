"""A server with the tiny Wan video engine for the video route tests."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import av
import numpy as np

from rtserve.app import build_app
from rtserve.config import ServerConfig
from tests.support import serve_app

# A job that holds the tiny engine for seconds (200 steps took only 0.6 s on the 2-core machine):
# the tests that need a request to wait, or a job still running, use it.
HOLDING = {"num_inference_steps": 2000, "num_frames": 41}


def video_config(config: ServerConfig, weights: Path, store: Path, **videos: object) -> ServerConfig:
    limits = {
        "store_dir": str(store),
        "default_size": "64x64",
        "default_fps": 8,
        "default_seconds": 1.0,
        "default_num_inference_steps": 2,
        "default_guidance_scale": 1.0,
        "max_upload_bytes": 64 * 1024,
        "max_inference_steps": HOLDING["num_inference_steps"],
        **videos,
    }
    return config.model_copy(
        update={
            "engine": "loopback",
            "video_engine": config.video_engine.model_copy(update={"weights": str(weights)}),
            "videos": config.videos.model_copy(update=limits),
        }
    )


@asynccontextmanager
async def video_server(config: ServerConfig) -> AsyncIterator[str]:
    """The server's base URL once its video engine serves (it loads in the background: 503 until then)."""
    async with serve_app(build_app(config)) as base, aiohttp.ClientSession() as http:
        for _ in range(400):
            async with http.post(f"{base}/v1/videos", json={}) as response:
                if response.status != 503:
                    break
            await asyncio.sleep(0.05)
        yield base


def decode_mp4(data: bytes) -> tuple[list[np.ndarray], float, tuple[int, int], str]:
    """Frames, frame rate, (width, height) and codec of an MP4, as PyAV reads them."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        return frames, float(stream.average_rate or 0), (stream.width, stream.height), stream.codec_context.name
