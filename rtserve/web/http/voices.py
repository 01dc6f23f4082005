"""``GET/POST /v1/audio/voices``, ``DELETE /v1/audio/voices/{name}`` (docs/serving.md#speech).

Registering a Piper voice: ``multipart/form-data`` with ``name``, the ``.onnx`` model as the
file part ``model`` (or ``audio_sample``, the part the OpenAI SDK's ``audio.voices.create``
sends) and its ``.onnx.json`` config as the part ``config`` (a file or a text field). The
name is checked before any byte of the model is read; each part is bounded while it
streams in (``voices.max_model_bytes``, ``voices.max_config_bytes``: 413 beyond); the TTS
engine then proves and stores it (``engines/cascade/voices.py``); with ``--workers N`` the
bytes go to the engine process over the engine link, so every worker can use the voice at
once. Answers follow the SDK's ``Voice`` / ``VoiceDeleted`` objects (``id`` is the name).
"""

from __future__ import annotations

from typing import Any

from aiohttp import BodyPartReader, web

from rtserve.engines.values import VoiceInfo
from rtserve.engines.voice_names import check_voice_name
from rtserve.errors import MALFORMED_REQUEST, MISSING_PARAMETER
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.common import body_deadline, engine_errors, read_part, reject_oversized, require_tts

_MODEL_PARTS = ("model", "audio_sample")
_FIELD_BYTES = 1024  # ``name`` and other small text fields


def voice_object(info: VoiceInfo) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "audio.voice",
        "name": info.name,
        "type": "audio_sample",
        "created_at": info.created_at,
        **info.public(),
    }


async def list_voices(request: web.Request) -> web.Response:
    tts = require_tts(request.app[CTX], None)
    with engine_errors():
        voices = await tts.voice_list()
    return web.json_response(
        {
            "object": "list",
            "data": [voice_object(v) for v in voices],
            "voices": [v.name for v in voices],
            "uploaded_voices": [voice_object(v) for v in voices if not v.builtin],
        }
    )


async def register_voice(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    limits = ctx.config.voices
    tts = require_tts(ctx, None)
    body_limit = limits.max_model_bytes + limits.max_config_bytes + 64 * 1024  # parts' headers and fields
    reject_oversized(request, body_limit)
    if not request.content_type.startswith("multipart/"):
        raise ApiError(
            "Register a voice with multipart/form-data: 'name', 'model' (.onnx) and 'config' (.onnx.json).",
            code=MALFORMED_REQUEST,
        )
    fields: dict[str, bytes] = {}
    async with body_deadline(request, body_limit):
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or part.name is None or part.name in fields:
                raise ApiError("Unexpected or repeated multipart part.", code=MALFORMED_REQUEST)
            name = "model" if part.name in _MODEL_PARTS else part.name
            if name == "name" and "model" not in fields:
                fields[name] = await read_part(part, _FIELD_BYTES)
                with engine_errors():  # a bad name is refused before the model is read
                    check_voice_name(fields[name].decode("utf-8", "replace"))
            elif name in ("model", "config", "name"):
                fields[name] = await read_part(
                    part, limits.max_model_bytes if name == "model" else limits.max_config_bytes
                )
            else:
                await read_part(part, _FIELD_BYTES)  # e.g. the SDK's "consent": accepted, unused
    missing = [key for key in ("name", "model", "config") if key not in fields]
    if missing:
        raise ApiError(f"Missing required parameter: '{missing[0]}'.", param=missing[0], code=MISSING_PARAMETER)
    voice_name = fields["name"].decode("utf-8", "replace")
    with engine_errors():
        check_voice_name(voice_name)
        info = await tts.add_voice(voice_name, fields["model"], fields["config"])
    return web.json_response(voice_object(info))


async def delete_voice(request: web.Request) -> web.Response:
    tts = require_tts(request.app[CTX], None)
    name = request.match_info["name"]
    with engine_errors():
        await tts.remove_voice(name)
    return web.json_response({"id": name, "object": "audio.voice.deleted", "deleted": True})


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/audio/voices", list_voices)
    app.router.add_post("/v1/audio/voices", register_voice)
    app.router.add_delete("/v1/audio/voices/{name}", delete_voice)
