"""Image bytes in and out (run on the codec executor: PIL work is too long for the event loop).

An upload is opened header first: its format and its pixel count are checked before any pixel
is decoded, so a small file that would decode to gigabytes (a decompression bomb) is refused.
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

from rtserve.errors import INVALID_IMAGE
from rtserve.web.errors import ApiError

ACCEPTED = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}  # upload formats, as PIL names them
CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def decode_upload(data: bytes, max_pixels: int) -> Image.Image:
    """The uploaded image as RGB, or a 400 ``invalid_image`` naming ``image``."""
    try:
        with Image.open(io.BytesIO(data)) as opened:  # reads the header only
            if opened.format not in ACCEPTED:
                raise ApiError(
                    f"Unsupported image format {opened.format or 'unknown'}: upload PNG, JPEG or WEBP.",
                    code=INVALID_IMAGE,
                    param="image",
                )
            if opened.width * opened.height > max_pixels:
                raise ApiError(
                    f"The image has {opened.width}x{opened.height} pixels; at most {max_pixels} are accepted.",
                    code=INVALID_IMAGE,
                    param="image",
                )
            return opened.convert("RGB")
    except ApiError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise ApiError(
            "The uploaded file is not a readable PNG, JPEG or WEBP image.", code=INVALID_IMAGE, param="image"
        ) from None


def encode(images: list[Image.Image], output_format: str, compression: int) -> list[bytes]:
    """Each image in ``output_format``; ``compression`` (0-100) is the JPEG/WEBP quality."""
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        if output_format == "png":
            image.save(buffer, format="PNG")
        else:
            image.save(buffer, format=output_format.upper(), quality=compression)
        encoded.append(buffer.getvalue())
    return encoded
