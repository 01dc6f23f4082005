"""The edit route's multipart body, read part by part with every part bounded while it arrives
(docs/serving.md#images): the image at ``images.max_upload_bytes``, each plain field at
``MAX_FIELD_BYTES``, at most ``MAX_PARTS`` parts. Everything stays in memory, so a refused or
failed request leaves nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import BodyPartReader, web

from rtserve.errors import INVALID_CONTENT_TYPE, INVALID_MULTIPART, INVALID_VALUE, MISSING_PARAMETER, REQUEST_TOO_LARGE
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.common import body_deadline, reject_oversized

MAX_FIELD_BYTES = 64 * 1024  # a prompt is a few KiB at most (images.max_prompt_chars)
MAX_PARTS = 64
_IMAGE_FIELDS = ("image", "image[]")  # the openai SDK sends one file as "image", a list as "image[]"
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class EditForm:
    image: bytes
    fields: dict[str, str]


async def read_edit_form(request: web.Request) -> EditForm:
    limits = request.app[CTX].config.images
    total = limits.max_upload_bytes + MAX_PARTS * MAX_FIELD_BYTES
    reject_oversized(request, total)
    if request.content_type != "multipart/form-data":
        raise ApiError(
            "Send the edit as multipart/form-data with an 'image' file.", param="image", code=INVALID_CONTENT_TYPE
        )
    image: bytes | None = None
    fields: dict[str, str] = {}
    try:
        async with body_deadline(request, total):
            reader = await request.multipart()
            for _ in range(MAX_PARTS):
                part = await reader.next()
                if part is None:
                    break
                if not isinstance(part, BodyPartReader):
                    raise ApiError("Nested multipart bodies are not accepted.", code=INVALID_MULTIPART)
                name = part.name or ""
                if name in _IMAGE_FIELDS:
                    if image is not None:
                        raise ApiError("Only one source image is supported.", code=INVALID_VALUE, param="image")
                    image = await _read_part(part, limits.max_upload_bytes, "image")
                elif part.filename is not None:
                    raise ApiError(
                        f"The file field {name!r} is not supported (only 'image').", code=INVALID_VALUE, param=name
                    )
                else:
                    raw = await _read_part(part, MAX_FIELD_BYTES, name)
                    fields[name] = raw.decode("utf-8", errors="replace")
            else:
                raise ApiError(f"More than {MAX_PARTS} multipart parts.", code=INVALID_MULTIPART)
    except ValueError:  # aiohttp's multipart parser: a malformed body
        raise ApiError("The multipart body could not be parsed.", code=INVALID_MULTIPART) from None
    if not image:
        raise ApiError("Missing required parameter: 'image' (an image file).", param="image", code=MISSING_PARAMETER)
    return EditForm(image, fields)


async def _read_part(part: BodyPartReader, limit: int, name: str) -> bytes:
    """The part's bytes, refused (413) as soon as more than ``limit`` have arrived."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise ApiError(
                f"'{name}' exceeds the limit of {limit} bytes.", status=413, code=REQUEST_TOO_LARGE, param=name
            )
        chunks.append(chunk)
    return b"".join(chunks)
