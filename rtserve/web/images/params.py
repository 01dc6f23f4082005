"""The image routes' parameters: one model for the JSON body and the edit form's plain fields,
then the server's limits and defaults applied (docs/serving.md#images).

Field names and meanings are the OpenAI Images API's plus the seed's diffusion extensions
(``seed``, ``num_inference_steps``, ``guidance_scale``, ``negative_prompt``; edits ``strength``).
Unknown fields are ignored, as the seed drops unknown extras; each refusal names its field.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from rtserve.config import ImagesConfig
from rtserve.engines.diffusion.service import ImageRequest
from rtserve.errors import INVALID_VALUE
from rtserve.web.errors import ApiError

ResponseFormat = Literal["b64_json", "url", "file"]
OutputFormat = Literal["png", "jpeg", "webp"]
_SIZE = re.compile(r"^([0-9]{1,6})x([0-9]{1,6})$")
_MAX_SEED = 2**63 - 1  # torch generators take a 64-bit seed


class ImageParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: str = Field(min_length=1)
    model: str | None = None
    n: int = Field(1, ge=1)
    size: str | None = None  # WIDTHxHEIGHT or "auto"
    response_format: ResponseFormat | None = None
    output_format: Literal["png", "jpeg", "jpg", "webp"] | None = None
    output_compression: int | None = Field(None, ge=0, le=100)
    seed: int | None = Field(None, ge=0, le=_MAX_SEED)
    num_inference_steps: int | None = Field(None, ge=1)
    guidance_scale: float | None = Field(None, ge=0, allow_inf_nan=False)
    negative_prompt: str | None = None
    strength: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)  # edits only
    stream: bool = False


@dataclass(frozen=True)
class ImagePlan:
    requests: list[ImageRequest]
    response_format: ResponseFormat
    output_format: OutputFormat
    compression: int
    size: str


def parse_size(value: str, multiple: int, max_pixels: int) -> tuple[int, int]:
    match = _SIZE.match(value)
    if match is None:
        raise ApiError(
            f"Invalid size format: {value!r}. Expected format: 'WIDTHxHEIGHT' (e.g. '512x512').",
            code=INVALID_VALUE,
            param="size",
        )
    width, height = int(match[1]), int(match[2])
    if width < multiple or height < multiple or width % multiple or height % multiple:
        raise ApiError(
            f"Invalid size {value!r}: width and height must be positive multiples of {multiple}.",
            code=INVALID_VALUE,
            param="size",
        )
    if width * height > max_pixels:
        raise ApiError(
            f"Invalid size {value!r}: at most {max_pixels} pixels (width * height) are served.",
            code=INVALID_VALUE,
            param="size",
        )
    return width, height


def fit_size(width: int, height: int, multiple: int, max_pixels: int) -> tuple[int, int]:
    """``size=auto`` for an edit: the source's size, scaled down to ``max_pixels`` and to multiples."""
    scale = min(1.0, (max_pixels / (width * height)) ** 0.5)
    return (
        max(multiple, int(width * scale) // multiple * multiple),
        max(multiple, int(height * scale) // multiple * multiple),
    )


def plan(
    params: ImageParams,
    limits: ImagesConfig,
    multiple: int,
    source: tuple[int, int] | None = None,
    image: Image.Image | None = None,
) -> ImagePlan:
    """The engine requests ``params`` ask for (``source``: an edit's image size), or a typed 400."""
    for name, text in (("prompt", params.prompt), ("negative_prompt", params.negative_prompt or "")):
        if len(text) > limits.max_prompt_chars:
            raise ApiError(
                f"{name} is longer than {limits.max_prompt_chars} characters.", code=INVALID_VALUE, param=name
            )
    if params.n > limits.max_n:
        raise ApiError(f"n must be less than or equal to {limits.max_n}.", code=INVALID_VALUE, param="n")
    steps = params.num_inference_steps or limits.default_steps
    if steps > limits.max_steps:
        raise ApiError(
            f"num_inference_steps must be less than or equal to {limits.max_steps}.",
            code=INVALID_VALUE,
            param="num_inference_steps",
        )
    if params.stream:
        raise ApiError(
            "Streaming partial images is not supported; send stream=false.", code=INVALID_VALUE, param="stream"
        )
    size = params.size or "auto"
    if size == "auto" and source is not None:
        width, height = fit_size(*source, multiple, limits.max_pixels)
    else:
        width, height = parse_size(limits.default_size if size == "auto" else size, multiple, limits.max_pixels)
    seed = params.seed if params.seed is not None else secrets.randbelow(2**31)
    requests = [
        ImageRequest(
            prompt=params.prompt,
            width=width,
            height=height,
            steps=steps,
            guidance_scale=limits.default_guidance_scale if params.guidance_scale is None else params.guidance_scale,
            seed=(seed + i) % (_MAX_SEED + 1),  # one image per seed: seed, seed + 1, ... (as the seed's outputs)
            negative_prompt=params.negative_prompt,
            image=image,
            strength=params.strength if params.strength is not None else limits.default_strength,
        )
        for i in range(params.n)
    ]
    output = params.output_format or "png"
    return ImagePlan(
        requests=requests,
        response_format=params.response_format or "b64_json",
        output_format="jpeg" if output == "jpg" else output,
        compression=100 if params.output_compression is None else params.output_compression,
        size=f"{width}x{height}",
    )
