"""Images into the conversation (docs/video.md): JPEG/PNG frames and ``input_image`` data URLs
checked, downscaled and re-encoded as one bounded JPEG, and camera frames (PyAV) the same way.

Every image a session holds went through here, so what reaches the LLM is a JPEG of at most
``video_input.max_side`` pixels a side, whatever the client sent. A sent image is refused
before it is decoded when it is larger than ``max_image_bytes`` or names more than
``max_image_pixels`` (PIL reads the size from the header; a decompression bomb is never
expanded). JPEGs are decoded at the smallest DCT scale that still covers ``max_side``
(libjpeg's ``draft``), which is most of the cost saved on a camera-sized frame.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import TYPE_CHECKING

from PIL import Image

from rtserve.errors import IMAGE_TOO_LARGE, INVALID_IMAGE, RtserveError

if TYPE_CHECKING:
    import av

    from rtserve.config import VideoInputConfig

_FORMATS = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG"}
_DATA_URL_PREFIXES = ("data:image/jpeg;base64,", "data:image/jpg;base64,", "data:image/png;base64,")


class ImageError(RtserveError, ValueError):
    """An image that is not a JPEG or PNG, or cannot be decoded."""

    code = INVALID_IMAGE


class ImageTooLarge(ImageError):
    code = IMAGE_TOO_LARGE


def check_image(data: bytes, limits: VideoInputConfig) -> Image.Image:
    """``data`` opened lazily (header read, pixels not decoded) if it is a JPEG or PNG within the bounds."""
    if len(data) > limits.max_image_bytes:
        raise ImageTooLarge(f"The image is {len(data)} bytes; at most {limits.max_image_bytes} are accepted.")
    if not any(data.startswith(magic) for magic in _FORMATS):
        raise ImageError("The image is not a JPEG or PNG.")
    try:
        image = Image.open(io.BytesIO(data), formats=list(_FORMATS.values()))
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError):
        raise ImageError("The image cannot be read as a JPEG or PNG.") from None
    width, height = image.size
    if width < 1 or height < 1 or width * height > limits.max_image_pixels:
        raise ImageTooLarge(f"The image is {width}x{height}; at most {limits.max_image_pixels} pixels are accepted.")
    return image


def image_data_url(data: bytes, limits: VideoInputConfig) -> str:
    """A sent JPEG/PNG as the bounded JPEG data URL the conversation keeps (blocking: a codec thread)."""
    image = check_image(data, limits)
    try:
        if image.format == "JPEG":
            image.draft("RGB", (limits.max_side, limits.max_side))  # decode at a reduced DCT scale
        image = image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise ImageError("The image is truncated or corrupt.") from None
    return _jpeg_url(image, limits)


def frame_data_url(frame: av.VideoFrame, limits: VideoInputConfig) -> str:
    """A decoded camera frame (PyAV) scaled to ``max_side`` by libswscale, as a JPEG data URL."""
    width, height = scaled_size(frame.width, frame.height, limits.max_side)
    return _jpeg_url(frame.to_image(width=width, height=height), limits)  # type: ignore[no-untyped-call]


def decoded_data_url(url: str, limits: VideoInputConfig) -> bytes:
    """The image bytes of a ``data:image/jpeg|png;base64,`` URL (only data URLs: the server fetches nothing)."""
    prefix = next((p for p in _DATA_URL_PREFIXES if url[: len(p)].lower() == p), None)
    if prefix is None:
        raise ImageError("image_url must be a data URL: data:image/jpeg;base64,... or data:image/png;base64,...")
    encoded = url[len(prefix) :]
    if len(encoded) * 3 // 4 > limits.max_image_bytes + 2:  # refused before decoding
        raise ImageTooLarge(f"The image is larger than {limits.max_image_bytes} bytes.")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("The image data URL is not valid base64.") from None


def bounded_url(url: str, limits: VideoInputConfig) -> str:
    """A client's ``input_image`` data URL as the bounded JPEG data URL the conversation keeps."""
    try:
        return image_data_url(decoded_data_url(url, limits), limits)
    except ImageError as exc:
        exc.param = "item.content"
        raise


def url_image(url: str) -> Image.Image:
    """A data URL this module made, as an RGB image (for a vision model's processor)."""
    data = base64.b64decode(url.split(",", 1)[1])
    return Image.open(io.BytesIO(data)).convert("RGB")


def scaled_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """``width`` x ``height`` shrunk (never grown) so the longer side is at most ``max_side``; even sizes
    (the chroma planes of the camera's YUV 4:2:0 halve them)."""
    scale = min(1.0, max_side / max(width, height))
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def _jpeg_url(image: Image.Image, limits: VideoInputConfig) -> str:
    if max(image.size) > limits.max_side:
        image = image.resize(scaled_size(*image.size, limits.max_side), Image.Resampling.BILINEAR, reducing_gap=2.0)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=limits.jpeg_quality)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")
