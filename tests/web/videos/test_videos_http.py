"""``/v1/videos`` and ``/v1/videos/sync`` over 127.0.0.1 against the tiny Wan engine: the official
``openai`` SDK's video calls unchanged, MP4s PyAV decodes to the frames and rate asked, jobs that
survive a restart, and every bad input answered with a typed 400 naming its field, leaving
nothing on disk (docs/serving.md#videos)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
from PIL import Image

from rtserve.config import ServerConfig
from rtserve.errors import JOB_INTERRUPTED
from tests.engines.diffusion.tiny_video_pipeline import write_tiny_wan
from tests.web.videos.video_support import HOLDING, decode_mp4, video_config, video_server


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("videos") / "tiny-wan")


@pytest.fixture
def video_cfg(config: ServerConfig, tiny_wan: Path, tmp_path: Path) -> ServerConfig:
    return video_config(config, tiny_wan, tmp_path / "store")


def _stored(config: ServerConfig) -> list[str]:
    """The videos in the job store's folder (not the database's files): none after a refusal or a delete."""
    return sorted(p.name for p in Path(config.videos.store_dir).iterdir() if not p.name.startswith("jobs.sqlite3"))


def _client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def _image(fmt: str = "PNG", size: tuple[int, int] = (80, 48)) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


async def test_openai_sdk_create_poll_list_download_delete(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, _client(base) as client:
        # 64x64: the tiny model's size, which the SDK's literals of OpenAI's sizes do not list.
        video = await client.videos.create_and_poll(prompt="a cat on the beach", model="tiny-wan", size="64x64")  # type: ignore[arg-type]
        assert video.status == "completed" and video.progress == 100 and video.model == "tiny-wan"
        assert video.size == "64x64" and video.seconds == "1.125" and video.expires_at is not None  # type: ignore[comparison-overlap]

        frames, rate, size, codec = decode_mp4((await client.videos.download_content(video.id)).content)
        assert (len(frames), rate, size, codec) == (9, 8.0, (64, 64), "h264")  # 1 s at 8 fps -> 4k + 1 frames

        listed = [v.id async for v in client.videos.list(limit=10)]
        assert listed == [video.id]
        deleted = await client.videos.delete(video.id)
        assert deleted.deleted and deleted.id == video.id
        with pytest.raises(openai.NotFoundError):
            await client.videos.retrieve(video.id)
        assert _stored(video_cfg) == []


async def test_image_to_video_from_an_sdk_upload(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, _client(base) as client:
        video = await client.videos.create_and_poll(
            prompt="a dog",
            input_reference=("ref.png", _image(), "image/png"),
            extra_body={"num_frames": 5, "fps": 4},
        )
        assert video.status == "completed", video.error
        frames, rate, _, _ = decode_mp4((await client.videos.download_content(video.id)).content)
        assert (len(frames), rate) == (5, 4.0)


async def test_jobs_survive_a_restart(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, _client(base) as client:
        done = await client.videos.create_and_poll(prompt="sunrise over water")
        mp4 = (await client.videos.download_content(done.id)).content
        # A long job the restart cuts short: it cannot resume, so it reads as failed afterwards.
        cut = await client.videos.create(prompt="mist", extra_body=HOLDING)
    async with video_server(video_cfg) as base, _client(base) as client:
        again = await client.videos.retrieve(done.id)
        assert again.status == "completed" and again.created_at == done.created_at
        assert (await client.videos.download_content(done.id)).content == mp4
        failed = await client.videos.retrieve(cut.id)
        assert failed.status == "failed" and failed.error is not None and failed.error.code == JOB_INTERRUPTED
        assert {v.id async for v in client.videos.list()} == {done.id, cut.id}


async def test_sync_answers_the_mp4(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, aiohttp.ClientSession() as http:
        body = {"prompt": "a cat", "width": 32, "height": 48, "num_frames": 5, "fps": 4, "seed": 1}
        async with http.post(f"{base}/v1/videos/sync", json=body) as response:
            assert response.status == 200 and response.content_type == "video/mp4"
            first = await response.read()
        async with http.post(f"{base}/v1/videos/sync", data=_form(body)) as response:  # multipart, same seed
            second = await response.read()
            assert response.status == 200, second
    frames, rate, size, _ = decode_mp4(first)
    assert (len(frames), rate, size) == (5, 4.0, (32, 48))
    frames, rate, size, _ = decode_mp4(second)  # the same fields as form fields
    assert (len(frames), rate, size) == (5, 4.0, (32, 48))


def _form(fields: dict[str, Any], files: dict[str, tuple[str, bytes, str]] | None = None) -> aiohttp.FormData:
    form = aiohttp.FormData()
    for name, value in fields.items():
        form.add_field(name, value if isinstance(value, str) else json.dumps(value))
    for name, (filename, data, content_type) in (files or {}).items():
        form.add_field(name, data, filename=filename, content_type=content_type)
    return form


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


BAD_JSON = [
    ({"prompt": "a", "num_inference_steps": 0}, "num_inference_steps", "greater than or equal to 1"),
    ({"prompt": "a", "num_inference_steps": -1}, "num_inference_steps", "greater than or equal to 1"),
    ({"prompt": "a", "num_inference_steps": 6000}, "num_inference_steps", "at most"),
    ({"prompt": "a", "size": "65x64"}, "size", "multiple of 16"),
    ({"prompt": "a", "size": "big"}, "size", "WIDTHxHEIGHT"),
    ({"prompt": "a", "num_frames": 6}, "num_frames", "4k + 1"),
    ({"prompt": "a", "seconds": 0}, "seconds", "greater than"),
    ({"prompt": ""}, "prompt", "at least 1"),
    ({"num_frames": 5}, "prompt", "Missing"),
    ({"prompt": "a", "model": "other"}, "model", "does not exist"),
    (
        {"prompt": "a", "image_reference": {"image_url": _data_url(b"x")}, "video_reference": {"video_url": "x"}},
        "video_reference",
        "does not support mixed image and video",
    ),
    (
        {"prompt": "a", "input_reference": {"image_url": "x"}, "image_reference": {"image_url": "y"}},
        "image_reference",
        "only one of input_reference, image_reference, or video_reference",
    ),
    ({"prompt": "a", "video_reference": {"video_url": "data:video/mp4;base64,AA=="}}, "video_reference", "video"),
    ({"prompt": "a", "image_reference": {"image_url": "https://example.com/a.png"}}, "image_reference", "data: URLs"),
    ({"prompt": "a", "image_reference": {"image_url": _data_url(_image("BMP"))}}, "image_reference", "PNG, JPEG"),
    ({"prompt": "a", "image_reference": {"image_url": "data:image/png;base64,!!"}}, "image_reference", "base64"),
]


async def test_bad_json_fields_are_typed_400s_naming_the_field(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, aiohttp.ClientSession() as http:
        for body, param, words in BAD_JSON:
            for route in ("/v1/videos", "/v1/videos/sync"):
                async with http.post(f"{base}{route}", json=body) as response:
                    error = (await response.json())["error"]
                    assert response.status == (404 if param == "model" else 400), error
                    assert error["param"] == param and words in error["message"], (body, error)
        async with http.get(f"{base}/v1/videos") as response:
            assert (await response.json())["data"] == []
        assert _stored(video_cfg) == []


async def test_bad_uploads_are_refused_while_they_arrive(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, aiohttp.ClientSession() as http:
        cases = [
            ({"input_reference": ("a.bmp", _image("BMP"), "image/bmp")}, 400, "input_reference", "PNG, JPEG"),
            ({"input_reference": ("a.mp4", b"\0\0\0\x18ftypmp42", "video/mp4")}, 400, "input_reference", "video"),
            ({"input_reference": ("a.png", b"\x89PNG" + bytes(70_000), "image/png")}, 413, None, "exceeds"),
            ({"input_reference": ("a.png", b"not an image", "image/png")}, 400, "input_reference", "not an image"),
        ]
        for files, status, param, words in cases:
            async with http.post(f"{base}/v1/videos", data=_form({"prompt": "a"}, files)) as response:
                error = (await response.json())["error"]
                assert response.status == status and error["param"] == param and words in error["message"], error
        mixed = _form(
            {"prompt": "a", "image_reference": {"image_url": "x"}},
            {"input_reference": ("a.png", _image(), "image/png")},
        )
        async with http.post(f"{base}/v1/videos", data=mixed) as response:
            error = (await response.json())["error"]
            assert response.status == 400 and "only one of" in error["message"]
        async with http.get(f"{base}/v1/videos") as response:
            assert (await response.json())["data"] == []
        assert _stored(video_cfg) == []


async def test_content_of_an_unfinished_or_unknown_job(video_cfg: ServerConfig) -> None:
    async with video_server(video_cfg) as base, aiohttp.ClientSession() as http, _client(base) as client:
        job = await client.videos.create(prompt="a", extra_body=HOLDING)
        async with http.get(f"{base}/v1/videos/{job.id}/content") as response:
            assert response.status == 409 and (await response.json())["error"]["code"] == "video_not_ready"
        assert (await client.videos.delete(job.id)).deleted  # cancels the running generation
        async with http.get(f"{base}/v1/videos/{job.id}/content") as response:
            assert response.status == 404 and (await response.json())["error"]["code"] == "video_not_found"
        await asyncio.sleep(0)


async def test_full_queue_is_429_and_a_slow_sync_is_504(config: ServerConfig, tiny_wan: Path, tmp_path: Path) -> None:
    cfg = video_config(config, tiny_wan, tmp_path / "store", sync_timeout_s=0.3)
    cfg = cfg.model_copy(update={"video_engine": cfg.video_engine.model_copy(update={"max_batch": 1, "max_queued": 1})})
    long = {"prompt": "a", **HOLDING}
    async with video_server(cfg) as base, aiohttp.ClientSession() as http, _client(base) as client:
        running = await client.videos.create(prompt="a", extra_body=long)
        for _ in range(200):  # until the engine took it into its batch: the queue is empty again
            if (await client.videos.retrieve(running.id)).status == "in_progress":
                break
            await asyncio.sleep(0.05)
        await client.videos.create(prompt="a", extra_body=long)  # waits in the one queue place
        with pytest.raises(openai.RateLimitError) as refused:
            await client.videos.create(prompt="a", extra_body=long)
        assert refused.value.code == "resource_exhausted"
        assert len([v async for v in client.videos.list()]) == 2  # the refused job left no row
        for video in [v async for v in client.videos.list()]:
            await client.videos.delete(video.id)  # frees the engine for the sync request
        for _ in range(200):  # cancelled jobs leave the engine's queue at its next step boundary
            async with http.post(f"{base}/v1/videos/sync", json=long) as response:
                error = (await response.json())["error"]
                if response.status != 429:
                    break
            await asyncio.sleep(0.05)
        assert response.status == 504 and error["code"] == "generation_timeout"
