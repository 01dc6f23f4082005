"""The video engine as the video routes reach it, or a typed 503 while it cannot serve."""

from __future__ import annotations

from aiohttp import web

from rtserve.engines.diffusion.video_request import VideoService
from rtserve.errors import ENGINE_FAILED, MODEL_NOT_READY
from rtserve.web.errors import ApiError

SERVICE = web.AppKey("video_service", VideoService)


def ready_service(app: web.Application) -> VideoService:
    service = app[SERVICE]
    if not service.ready:
        if service.failure:
            raise ApiError("The video model failed to load; see the server log.", status=503, code=ENGINE_FAILED)
        raise ApiError(
            "The video model is still loading; retry shortly.",
            status=503,
            code=MODEL_NOT_READY,
            headers={"Retry-After": "5"},
        )
    return service
