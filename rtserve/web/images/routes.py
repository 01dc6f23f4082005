"""Registers ``POST /v1/images/generations``, ``POST /v1/images/edits`` and
``GET /v1/images/files/{name}`` (docs/serving.md#images).

The routes exist on every server. Where ``image_engine.weights`` is set, the image engine
(built in this process, loaded in the background at startup, stopped at cleanup) serves them;
until it has loaded they answer 503 ``model_not_ready`` (``engine_failed`` if it could not load).
A server without one answers 404 ``images_unavailable``. Each image is its own engine request,
denoised in step with every other request of the same shape (the engine batches, not the
client: ``n`` images are ``n`` requests); a client that goes away cancels its requests, whose
slots free at the next step.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import time
import uuid
from dataclasses import dataclass

from aiohttp import web
from PIL import Image

from rtserve.engines.diffusion.job import DiffusionJob
from rtserve.engines.diffusion.service import ImageService
from rtserve.engines.errors import EngineError
from rtserve.errors import IMAGES_UNAVAILABLE, NOT_FOUND
from rtserve.web.context import CTX
from rtserve.web.diffusion_metrics import BatchedEngineCollector
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.common import engine_errors, not_serving, read_json, run_generation, validate
from rtserve.web.images import pictures
from rtserve.web.images.params import ImageParams, ImagePlan, plan
from rtserve.web.images.store import ImageStore
from rtserve.web.images.upload import read_edit_form
from rtserve.web.route_engine import run_with_app

GENERATIONS = "/v1/images/generations"
EDITS = "/v1/images/edits"
FILES = "/v1/images/files/{name}"


@dataclass(frozen=True)
class ImagesService:
    engine: ImageService | None
    store: ImageStore


IMAGES = web.AppKey("images", ImagesService)


def _engine(request: web.Request) -> ImageService:
    engine = request.app[IMAGES].engine
    if engine is None:
        raise ApiError(
            "This server has no image engine (image_engine.weights is not set).", status=404, code=IMAGES_UNAVAILABLE
        )
    if not engine.ready:
        raise not_serving("image", failed=engine.failure is not None)
    return engine


async def generations(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    params = await read_json(request, ImageParams)
    work = plan(params, request.app[CTX].config.images, engine.size_multiple)
    request_id = f"image-{uuid.uuid4().hex}"
    return await run_generation(request, request_id, functools.partial(_generate, request, engine, work))


async def edits(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    ctx = request.app[CTX]
    form = await read_edit_form(request)
    params = validate(ImageParams, dict(form.fields))
    source = await ctx.codecs.run(pictures.decode_upload, form.image, ctx.config.images.max_upload_pixels)
    work = plan(params, ctx.config.images, engine.size_multiple, source=source.size, image=source)
    request_id = f"image-edit-{uuid.uuid4().hex}"
    return await run_generation(request, request_id, functools.partial(_generate, request, engine, work))


async def files(request: web.Request) -> web.StreamResponse:
    stored = request.app[IMAGES].store.get(request.match_info["name"])
    if stored is None:
        raise ApiError("No such image (images are kept for images.url_ttl_s).", status=404, code=NOT_FOUND)
    return web.Response(body=stored.data, content_type=stored.content_type)


async def _generate(request: web.Request, engine: ImageService, work: ImagePlan) -> web.StreamResponse:
    with engine_errors():
        jobs = engine.submit(work.requests)
    try:
        images = await asyncio.gather(*(job.result() for job in jobs))
    except EngineError as exc:
        raise api_error(exc) from None
    finally:
        _cancel(jobs)  # the client went away, or one image failed: the others stop at the next step
    encoded = await request.app[CTX].codecs.run(pictures.encode, images, work.output_format, work.compression)
    content_type = pictures.CONTENT_TYPES[work.output_format]
    if work.response_format == "file":  # the seed's raw bytes of the first image
        extension = work.output_format
        return web.Response(
            body=encoded[0],
            content_type=content_type,
            headers={"Content-Disposition": f'attachment; filename="image.{extension}"'},
        )
    if work.response_format == "url":
        store = request.app[IMAGES].store
        names = [store.put(data, content_type, work.output_format) for data in encoded]
        data = [{"url": str(request.url.with_path(FILES.format(name=name)).with_query(None))} for name in names]
    else:
        data = [{"b64_json": base64.b64encode(item).decode("ascii")} for item in encoded]
    body = {
        "created": int(time.time()),
        "data": [{**item, "revised_prompt": None} for item in data],
        "output_format": work.output_format,
        "size": work.size,
    }
    return web.json_response(body)


def _cancel(jobs: list[DiffusionJob[Image.Image]]) -> None:
    for job in jobs:
        job.cancel()


def setup(app: web.Application, engine: ImageService | None) -> None:
    ctx = app[CTX]
    limits = ctx.config.images
    app[IMAGES] = ImagesService(engine, ImageStore(limits.max_stored_images, limits.url_ttl_s))
    app.router.add_post(GENERATIONS, generations)
    app.router.add_post(EDITS, edits)
    app.router.add_get(FILES, files)
    if engine is not None:
        ctx.registry.register(BatchedEngineCollector(engine, "image"))
        run_with_app(app, engine, "image")
