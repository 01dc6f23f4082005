"""``/v1/videos`` (jobs: create, retrieve, list, delete, download), ``POST /v1/videos/sync`` and
``WS /v1/realtime/video`` on the video engine (docs/serving.md#videos).

Registered only when a video engine is configured (``video_engine.weights``); elsewhere these
paths answer 404 like any unknown route. The engine loads in the background with the app
(``model_not_ready`` meanwhile); the job store opens at startup and a sweeper drops expired jobs
every ``videos.cleanup_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal, Protocol

from aiohttp import web

from rtserve.engines.diffusion.video_request import VideoService
from rtserve.engines.errors import EngineError
from rtserve.errors import (
    GENERATION_TIMEOUT,
    INVALID_VALUE,
    VIDEO_NOT_FOUND,
    VIDEO_NOT_READY,
    RtserveError,
)
from rtserve.web.context import CTX
from rtserve.web.diffusion_metrics import BatchedEngineCollector
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.common import generation_route, run_generation
from rtserve.web.route_engine import RouteEngine, run_with_app
from rtserve.web.videos import realtime
from rtserve.web.videos.job_runner import VideoJobs, render_mp4, submit
from rtserve.web.videos.job_store import StoreLimits, VideoJob, VideoJobStore
from rtserve.web.videos.metrics import METRICS, VideoMetrics
from rtserve.web.videos.params import read_video_request
from rtserve.web.videos.service import SERVICE, ready_service


class VideoEngineLike(VideoService, RouteEngine, Protocol):
    """The video engine: what the routes use, and the lifecycle the app runs it with."""


JOBS = web.AppKey("video_jobs", VideoJobs)
_SWEEPER = web.AppKey("video_job_sweeper", asyncio.Task[None])
_MAX_PAGE = 100
_POLL_AFTER_MS = 200


async def _job_or_404(request: web.Request) -> VideoJob:
    job_id = request.match_info["video_id"]
    job = await request.app[JOBS].store.get(job_id)
    if job is None:
        raise ApiError(f"No video '{job_id}'.", status=404, code=VIDEO_NOT_FOUND, param="video_id")
    return job


async def create_video(request: web.Request) -> web.Response:
    parsed = await read_video_request(request, ready_service(request.app))
    try:
        job = await request.app[JOBS].create(parsed)
    except RtserveError as exc:
        raise api_error(exc) from None
    return web.json_response(job.public())


async def retrieve_video(request: web.Request) -> web.Response:
    job = await _job_or_404(request)
    # The SDK's poll helper waits as long as this header says between retrievals.
    return web.json_response(job.public(), headers={"openai-poll-after-ms": str(_POLL_AFTER_MS)})


async def list_videos(request: web.Request) -> web.Response:
    query = request.query
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError("'order' must be 'asc' or 'desc'.", param="order", code=INVALID_VALUE)
    limit_text = query.get("limit", "20")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= _MAX_PAGE:
        raise ApiError(f"'limit' must be from 1 to {_MAX_PAGE}.", param="limit", code=INVALID_VALUE)
    direction: Literal["asc", "desc"] = "asc" if order == "asc" else "desc"
    jobs, more = await request.app[JOBS].store.list(after=query.get("after"), limit=int(limit_text), order=direction)
    return web.json_response(
        {
            "object": "list",
            "data": [job.public() for job in jobs],
            "first_id": jobs[0].id if jobs else None,
            "last_id": jobs[-1].id if jobs else None,
            "has_more": more,
        }
    )


async def delete_video(request: web.Request) -> web.Response:
    job = await _job_or_404(request)
    await request.app[JOBS].delete(job.id)
    return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})


async def video_content(request: web.Request) -> web.StreamResponse:
    variant = request.query.get("variant", "video")
    if variant != "video":
        raise ApiError("Only the 'video' variant is served.", param="variant", code=INVALID_VALUE)
    job = await _job_or_404(request)
    if job.status != "completed":
        raise ApiError(f"The video is {job.status}, not completed.", status=409, code=VIDEO_NOT_READY)
    path = request.app[JOBS].store.file(job.id)
    if not path.exists():  # deleted or expired between the read and now
        raise ApiError(f"No video '{job.id}'.", status=404, code=VIDEO_NOT_FOUND, param="video_id")
    return web.FileResponse(path, headers={"Content-Type": "video/mp4"})


@generation_route
async def create_video_sync(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    parsed = await read_video_request(request, ready_service(request.app))

    async def work() -> web.StreamResponse:
        try:
            generation = submit(request.app[SERVICE], parsed, asyncio.Event(), request.app[METRICS])
            async with asyncio.timeout(ctx.config.videos.sync_timeout_s):
                mp4 = await render_mp4(generation, parsed.fps, ctx.codecs)
        except TimeoutError:
            raise ApiError(
                "The video took longer than videos.sync_timeout_s.", status=504, code=GENERATION_TIMEOUT
            ) from None
        except EngineError as exc:
            raise api_error(exc) from None
        return web.Response(body=mp4, content_type="video/mp4")

    return await run_generation(request, f"video-sync-{id(parsed)}", work)


async def _open_store(app: web.Application) -> None:
    limits = app[CTX].config.videos
    store = await VideoJobStore.open(
        limits.store_dir, StoreLimits(limits.job_ttl_s, limits.max_jobs, limits.max_store_bytes)
    )
    app[JOBS] = VideoJobs(store, app[SERVICE], app[CTX].codecs, app[METRICS])

    async def sweep() -> None:
        while True:
            await asyncio.sleep(limits.cleanup_interval_s)
            await store.sweep()

    app[_SWEEPER] = asyncio.create_task(sweep(), name="video-job-sweeper")


async def _close_store(app: web.Application) -> None:
    app[_SWEEPER].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await app[_SWEEPER]
    await app[JOBS].close()
    await app[JOBS].store.close()


def setup(app: web.Application, engine: VideoEngineLike | None) -> None:
    if engine is None:
        return
    app[SERVICE] = engine
    registry = app[CTX].registry
    app[METRICS] = VideoMetrics(registry)
    registry.register(BatchedEngineCollector(engine, "video"))
    run_with_app(app, engine, "video")
    app.on_startup.append(_open_store)
    app.on_shutdown.append(_close_store)
    app.router.add_post("/v1/videos", create_video)
    app.router.add_get("/v1/videos", list_videos)
    app.router.add_post("/v1/videos/sync", create_video_sync)
    app.router.add_get("/v1/videos/{video_id}", retrieve_video)
    app.router.add_delete("/v1/videos/{video_id}", delete_video)
    app.router.add_get("/v1/videos/{video_id}/content", video_content)
    realtime.setup(app)
