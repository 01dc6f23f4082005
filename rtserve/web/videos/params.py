"""A video request as clients send it -> a checked ``VideoRequest`` (docs/serving.md#videos).

``POST /v1/videos`` and ``/v1/videos/sync`` take ``multipart/form-data`` (the OpenAI SDK, ``curl -F``:
plain form fields, the reference image as the file part ``input_reference``) or a JSON object.
Every bad value is a 400 naming its field: steps below 1, a size the model cannot make, frame
counts it cannot decode, more than one kind of reference, references this model does not take
(video, audio, remote URLs), image formats other than PNG, JPEG and WebP. Uploads are bounded
while they arrive (``videos.max_upload_bytes``: 413 beyond) and kept in memory only, so a
refused request leaves nothing on disk.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from aiohttp import BodyPartReader, web
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from rtserve import untrusted_json
from rtserve.codecs.fmp4 import RgbFrames
from rtserve.config import VideoRoutesConfig
from rtserve.engines.diffusion.video_request import VideoRequest, VideoService
from rtserve.errors import INVALID_JSON, INVALID_VALUE, MALFORMED_REQUEST, MODEL_NOT_FOUND, UNSUPPORTED_FORMAT
from rtserve.web.context import CTX, AppContext
from rtserve.web.errors import ApiError
from rtserve.web.http.common import body_deadline, body_too_large, read_body, read_part, reject_oversized, validate

_IMAGE_FORMATS = {"PNG", "JPEG", "WEBP"}
_FIELD_BYTES = 64 * 1024  # one text field (the prompt is the longest)
_JSON_FIELDS = ("image_reference", "video_reference", "audio_reference", "extra_params", "lora")


class VideoParams(BaseModel):
    """The fields this server reads; others (the seed's model-specific extras) are ignored."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = Field(min_length=1)
    model: str | None = None
    size: str | None = None
    seconds: float | None = Field(None, gt=0)
    width: int | None = Field(None, ge=1)
    height: int | None = Field(None, ge=1)
    fps: int | None = Field(None, ge=1, le=120)
    num_frames: int | None = Field(None, ge=1)
    num_inference_steps: int | None = Field(None, ge=1)
    guidance_scale: float | None = Field(None, ge=0)
    seed: int | None = None
    negative_prompt: str = ""
    input_reference: dict[str, Any] | None = None  # {"image_url": ...} (an upload arrives as bytes)
    image_reference: dict[str, Any] | list[dict[str, Any]] | None = None
    video_reference: dict[str, Any] | list[dict[str, Any]] | None = None
    audio_reference: dict[str, Any] | list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ParsedVideo:
    request: VideoRequest
    model: str
    size: str  # WIDTHxHEIGHT
    seconds: str  # as asked, or frames over rate
    fps: int


def _bad(message: str, param: str, code: str = INVALID_VALUE) -> ApiError:
    return ApiError(message, param=param, code=code)


async def read_video_body(request: web.Request, limits: VideoRoutesConfig) -> tuple[dict[str, Any], bytes | None]:
    """The request's fields and its uploaded reference image, if any."""
    body_limit = limits.max_upload_bytes * 2 + 256 * 1024  # a data URL's base64 and the other fields
    if request.content_type == "application/json":
        raw = await read_body(request, body_limit)
        try:
            data = untrusted_json.loads(raw)
        except ValueError:
            raise ApiError("The request body is not valid JSON.", code=INVALID_JSON) from None
        if not isinstance(data, dict):
            raise ApiError("The request body must be a JSON object.", code=INVALID_JSON)
        return data, None
    if request.content_type == "application/x-www-form-urlencoded":  # plain fields, no upload (curl -d)
        raw = await read_body(request, body_limit)
        pairs = urllib.parse.parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True)
        return _form_fields(pairs), None
    if request.content_type != "multipart/form-data":
        raise ApiError("Send multipart/form-data, form fields or a JSON object.", code=MALFORMED_REQUEST)
    reject_oversized(request, body_limit)
    texts: list[tuple[str, str]] = []
    upload: bytes | None = None
    async with body_deadline(request, body_limit):
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name is None:
                raise ApiError("Unexpected multipart part.", code=MALFORMED_REQUEST)
            name = part.name
            if part.filename is not None:  # an uploaded file: only one reference image is taken
                if name not in ("input_reference", "input_references"):
                    raise _bad(f"Unexpected file part '{name}'.", name)
                kind = (part.headers.get("Content-Type") or "application/octet-stream").split("/")[0]
                if kind in ("video", "audio"):
                    raise _bad(f"This model does not take {kind} references.", name, UNSUPPORTED_FORMAT)
                if upload is not None:
                    raise _bad("This model takes one reference image.", name)
                upload = await read_part(part, limits.max_upload_bytes)
                continue
            texts.append((name, (await read_part(part, _FIELD_BYTES)).decode("utf-8", "replace")))
    return _form_fields(texts), upload


def _form_fields(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Form fields as the JSON body would hold them: typed references are JSON text, and the
    SDK sends ``{"image_url": ...}`` as ``input_reference[image_url]``."""
    fields: dict[str, Any] = {}
    for name, text in pairs:
        if name.startswith("input_reference[") and name.endswith("]"):
            fields.setdefault("input_reference", {})[name[len("input_reference[") : -1]] = text
        elif name in _JSON_FIELDS:
            try:
                fields[name] = untrusted_json.loads(text)
            except ValueError:
                raise _bad(f"'{name}' must be JSON.", name) from None
        else:
            fields[name] = text
    return fields


def _one_image_url(params: VideoParams, upload: bytes | None) -> tuple[str, str | None] | None:
    """The one image reference as (param, data URL or None for an upload); mixed kinds refused."""
    given = [
        name
        for name, value in (
            ("input_reference", upload is not None or params.input_reference is not None),
            ("image_reference", params.image_reference is not None),
            ("video_reference", params.video_reference is not None),
        )
        if value
    ]
    if "input_reference" in given and len(given) > 1:
        raise _bad("Give only one of input_reference, image_reference, or video_reference.", given[1])
    if "image_reference" in given and "video_reference" in given:
        raise _bad("This model does not support mixed image and video references.", "video_reference")
    if params.video_reference is not None:
        raise _bad("This model does not take video references.", "video_reference", UNSUPPORTED_FORMAT)
    if params.audio_reference is not None:
        raise _bad("This model does not take audio references.", "audio_reference", UNSUPPORTED_FORMAT)
    if upload is not None:
        return "input_reference", None
    ref: Any = params.input_reference if params.input_reference is not None else params.image_reference
    param = "input_reference" if params.input_reference is not None else "image_reference"
    if ref is None:
        return None
    if isinstance(ref, list):
        if len(ref) != 1:
            raise _bad("This model takes one reference image.", param)
        ref = ref[0]
    url = ref.get("image_url")
    if isinstance(url, dict):  # {"image_url": {"url": ...}} as in chat messages
        url = url.get("url")
    if not isinstance(url, str):
        raise _bad("A reference image needs 'image_url'.", param)
    return param, url


def _data_url_bytes(url: str, param: str, limit: int) -> bytes:
    if not url.startswith("data:"):
        raise _bad("Reference images must be data: URLs (this server fetches no URLs).", param, UNSUPPORTED_FORMAT)
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise _bad("A data: URL reference must be base64.", param)
    if len(payload) > limit * 4 // 3 + 4:
        raise body_too_large(limit)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("The reference image is not valid base64.", param) from None


def decode_reference(data: bytes, param: str, width: int, height: int, max_pixels: int) -> RgbFrames:
    """A PNG, JPEG or WebP image resized to the video's size as ``(1, height, width, 3)`` RGB
    (codec work: run it on the codec executor). Its pixel count is checked from the header first."""
    try:
        image = Image.open(io.BytesIO(data))
    except (OSError, ValueError, Image.DecompressionBombError):
        raise _bad("The reference image is not an image.", param, UNSUPPORTED_FORMAT) from None
    if image.format not in _IMAGE_FORMATS:
        raise _bad(f"Reference images must be PNG, JPEG or WebP, not {image.format}.", param, UNSUPPORTED_FORMAT)
    if image.width * image.height > max_pixels:
        raise _bad(f"The reference image is over {max_pixels} pixels.", param)
    try:
        rgb = image.convert("RGB").resize((width, height), Image.Resampling.LANCZOS)
    except (OSError, ValueError):
        raise _bad("The reference image cannot be decoded.", param, UNSUPPORTED_FORMAT) from None
    return np.asarray(rgb, dtype=np.uint8)[None]


def _dimensions(params: VideoParams, limits: VideoRoutesConfig, multiple: int) -> tuple[int, int]:
    size = params.size or limits.default_size
    width_text, sep, height_text = size.partition("x")
    if not (sep and width_text.isdigit() and height_text.isdigit()):
        raise _bad(f"'size' must be WIDTHxHEIGHT, not {size!r}.", "size")
    width, height = params.width or int(width_text), params.height or int(height_text)
    for name, value in (("width", width), ("height", height)):
        param = name if getattr(params, name) is not None else "size"
        if value % multiple or not multiple <= value <= limits.max_side:
            raise _bad(f"The {name} must be a multiple of {multiple} from {multiple} to {limits.max_side}.", param)
    return width, height


def _frames(params: VideoParams, limits: VideoRoutesConfig, fps: int, multiple: int) -> int:
    if params.num_frames is not None:
        if (params.num_frames - 1) % multiple:
            raise _bad(
                f"'num_frames' must be {multiple}k + 1 (1, {multiple + 1}, {2 * multiple + 1}, ...).", "num_frames"
            )
        frames, param = params.num_frames, "num_frames"
    else:
        wanted = round((params.seconds or limits.default_seconds) * fps)
        frames, param = multiple * max(1, math.ceil((wanted - 1) / multiple)) + 1, "seconds"
    if frames > limits.max_frames:
        raise _bad(f"At most {limits.max_frames} frames ({frames} asked).", param)
    return frames


def parse_video(
    fields: dict[str, Any], upload: bytes | None, service: VideoService, limits: VideoRoutesConfig
) -> tuple[ParsedVideo, tuple[str, bytes] | None]:
    """The checked request, and the reference image's bytes with the field they came in (decoded
    by the caller on the codec executor)."""
    params = validate(VideoParams, fields)
    if params.model is not None and params.model != service.model_name and params.model not in limits.model_aliases:
        raise ApiError(
            f"The model '{params.model}' does not exist; this server's video model is '{service.model_name}'.",
            status=404,
            code=MODEL_NOT_FOUND,
            param="model",
        )
    steps = params.num_inference_steps or limits.default_num_inference_steps
    if steps > limits.max_inference_steps:
        raise _bad(f"'num_inference_steps' must be at most {limits.max_inference_steps}.", "num_inference_steps")
    width, height = _dimensions(params, limits, service.size_multiple)
    fps = params.fps or limits.default_fps
    frames = _frames(params, limits, fps, service.frame_multiple)
    reference = None
    image = _one_image_url(params, upload)
    if image is not None:
        param, url = image
        data = upload if url is None else _data_url_bytes(url, param, limits.max_upload_bytes)
        assert data is not None  # an upload when no URL
        if len(data) > limits.max_upload_bytes:
            raise body_too_large(limits.max_upload_bytes)
        reference = (param, data)
    request = VideoRequest(
        prompt=params.prompt,
        width=width,
        height=height,
        num_frames=frames,
        num_inference_steps=steps,
        guidance_scale=params.guidance_scale if params.guidance_scale is not None else limits.default_guidance_scale,
        seed=params.seed,
        negative_prompt=params.negative_prompt,
    )
    seconds = f"{params.seconds:g}" if params.seconds is not None else f"{frames / fps:g}"
    return ParsedVideo(request, params.model or service.model_name, f"{width}x{height}", seconds, fps), reference


async def read_reference(ctx: AppContext, parsed: ParsedVideo, reference: tuple[str, bytes] | None) -> ParsedVideo:
    """``parsed`` with its reference image decoded (on the codec executor), if it has one."""
    if reference is None:
        return parsed
    param, data = reference
    r = parsed.request
    limit = ctx.config.videos.max_reference_pixels
    image = await ctx.codecs.run(decode_reference, data, param, r.width, r.height, limit)
    return replace(parsed, request=replace(r, image=image))


async def read_video_request(request: web.Request, service: VideoService) -> ParsedVideo:
    """Read, check and (with a reference image) decode one HTTP video request."""
    ctx = request.app[CTX]
    fields, upload = await read_video_body(request, ctx.config.videos)
    parsed, reference = parse_video(fields, upload, service, ctx.config.videos)
    return await read_reference(ctx, parsed, reference)
