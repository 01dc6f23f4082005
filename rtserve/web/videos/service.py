"""The video engine as the video routes reach it, or a typed 503 while it cannot serve."""

from __future__ import annotations

from aiohttp import web

from rtserve.engines.diffusion.video_request import VideoService
from rtserve.web.http.common import not_serving

SERVICE = web.AppKey("video_service", VideoService)


def ready_service(app: web.Application) -> VideoService:
    service = app[SERVICE]
    if not service.ready:
        raise not_serving("video", failed=bool(service.failure))
    return service
