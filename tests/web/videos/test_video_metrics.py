"""``/metrics`` of a server with the tiny Wan video engine, read over 127.0.0.1 after real jobs,
a sync video and a realtime stream: the engine's step counters (``rtserve_video_*``, the same
families as the image engine's), jobs by status, realtime sessions and chunks, the first-frames
histogram; and the 503 a video route answers when its engine failed to load
(docs/serving.md#videos)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.errors import ENGINE_FAILED, MODEL_NOT_READY
from tests.engines.diffusion.tiny_video_pipeline import write_tiny_wan
from tests.support import serve_app
from tests.web.videos.video_support import HOLDING, video_config, video_server

SMALL = {"width": 32, "height": 32, "num_frames": 5, "fps": 4, "num_inference_steps": 2, "seed": 1}


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_wan(tmp_path_factory.mktemp("video-metrics") / "tiny-wan")


async def _video_metrics(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """``rtserve_video_*`` samples by name and labels, e.g. ``rtserve_video_jobs{status=queued}``."""
    async with http.get(f"{base}/metrics") as response:
        text = await response.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("rtserve_video_") and not sample.name.endswith("_created"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "le")
                if "le" not in sample.labels:
                    samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


async def _stream(base: str) -> list[bytes]:
    """One realtime video: the binary chunks it sent."""
    chunks = []
    async with websockets.connect(base.replace("http://", "ws://") + "/v1/realtime/video") as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "a cat", **SMALL}))
        while (event := json.loads(await ws.recv()))["type"] != "session.done":
            if event["type"] == "video.chunk_metadata":
                chunk = await ws.recv()
                assert isinstance(chunk, bytes)
                chunks.append(chunk)
            else:
                assert event["type"] == "video.start", event
    return chunks


async def test_metrics_after_a_job_a_sync_video_a_stream_and_a_delete(
    config: ServerConfig, tiny_wan: Path, tmp_path: Path
) -> None:
    cfg = video_config(config, tiny_wan, tmp_path / "store")
    async with (
        video_server(cfg) as base,
        aiohttp.ClientSession() as http,
        openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client,
    ):
        before = await _video_metrics(http, base)
        assert before["rtserve_video_denoiser_calls_total"] == 0 and before["rtserve_video_requests_queued"] == 0
        assert before["rtserve_video_jobs{status=queued}"] == 0 and before["rtserve_video_realtime_sessions"] == 0

        job = await client.videos.create_and_poll(prompt="a cat", extra_body=SMALL)
        assert job.status == "completed"
        async with http.post(f"{base}/v1/videos/sync", json={"prompt": "a dog", **SMALL}) as response:
            assert response.status == 200
        chunks = await _stream(base)
        long = await client.videos.create(
            prompt="a dog", extra_body={**SMALL, "num_inference_steps": HOLDING["num_inference_steps"]}
        )
        await client.videos.delete(long.id)  # cancelled while queued or running

        # The stream's handler ends just after the client saw it close; the deleted job leaves
        # the engine at its next step boundary.
        settled = ("rtserve_video_realtime_sessions", "rtserve_video_requests_running", "rtserve_video_requests_queued")
        for _ in range(100):
            after = await _video_metrics(http, base)
            if not any(after[name] for name in settled):
                break
            await asyncio.sleep(0.05)
    assert after["rtserve_video_realtime_sessions"] == 0
    assert after["rtserve_video_realtime_chunks_total"] == len(chunks)
    assert after["rtserve_video_realtime_chunk_bytes_total"] == sum(len(c) for c in chunks)
    # three videos denoised to the end, one after another: 2 steps each, never shared
    assert after["rtserve_video_requests_finished_total"] == 3
    assert after["rtserve_video_request_steps_total"] - after["rtserve_video_denoiser_calls_total"] == 0
    assert after["rtserve_video_denoiser_calls_total"] >= 6 and after["rtserve_video_shared_denoiser_calls_total"] == 0
    assert after["rtserve_video_requests_running"] == after["rtserve_video_requests_queued"] == 0
    assert after["rtserve_video_jobs_ended_total{status=completed}"] == 1
    assert after["rtserve_video_jobs_ended_total{status=cancelled}"] == 1
    assert after["rtserve_video_jobs{status=queued}"] == after["rtserve_video_jobs{status=in_progress}"] == 0
    assert after["rtserve_video_first_frames_seconds_count"] == 3  # the job, the sync video, the stream


async def test_a_failed_engine_is_a_typed_503_on_every_video_route(config: ServerConfig, tmp_path: Path) -> None:
    not_a_pipeline = tmp_path / "empty"
    not_a_pipeline.mkdir()
    cfg = video_config(config, not_a_pipeline, tmp_path / "store")
    async with serve_app(build_app(cfg)) as base, aiohttp.ClientSession() as http:
        for _ in range(200):
            async with http.post(f"{base}/v1/videos", json={"prompt": "a cat"}) as response:
                assert response.status == 503
                error = (await response.json())["error"]
                if error["code"] != MODEL_NOT_READY:
                    break
                assert response.headers["Retry-After"] == "5"
            await asyncio.sleep(0.05)
        assert error["code"] == ENGINE_FAILED and "video engine" in error["message"]
        async with websockets.connect(base.replace("http://", "ws://") + "/v1/realtime/video") as ws:
            await ws.send(json.dumps({"type": "session.start", "prompt": "a cat", **SMALL}))
            event = json.loads(await ws.recv())
            assert event["type"] == "error" and event["code"] == ENGINE_FAILED
        metrics = await _video_metrics(http, base)
    assert "rtserve_video_denoiser_calls_total" not in metrics  # no engine counters from an engine that never served
    assert metrics["rtserve_video_jobs{status=queued}"] == 0
