"""``POST /v1/audio/speech/batch`` (docs/serving.md#speech): several inputs, one response.

Body: ``{"items": [{"input": ..., "voice"?, "response_format"?, "speed"?}, ...]}`` plus
top-level defaults for ``voice``, ``response_format``, ``speed`` and ``model``. At most
``http.max_speech_batch_items`` items, each input at most ``http.max_speech_input_chars``.
Items are spoken one after another (the TTS has one thread; running them side by side
would only interleave) under the request's one generation slot. The answer lists a result
per item in input order: ``{"index", "status": "success", "audio_data" (base64),
"media_type", "usage"}`` or ``{"index", "status": "error", "error": {...}}``; one bad item
never fails the others. A malformed request as a whole is a plain 400.

The audio of all items together is bounded (``http.max_speech_batch_s``), counted as each
sentence comes out of the synthesizer: the item that crosses the bound stops there and fails
``speech_too_long``, and so does every later item, without being synthesized.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import math
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import TTSEngine
from rtserve.errors import INVALID_VALUE, SPEECH_TOO_LONG
from rtserve.web.context import CTX
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.audio import CONTENT_TYPES, SPEECH_SAMPLE_RATE, SpeechFormat
from rtserve.web.http.common import generation_route, read_json, require_tts, run_generation, validation_error
from rtserve.web.http.speech import SpeechPipeline, SpeechRequest, VoiceRef


class SpeechBatchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    voice: str | VoiceRef | None = None
    response_format: SpeechFormat = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)


@generation_route
async def create_speech_batch(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    body = await read_json(request, SpeechBatchRequest)
    limit = ctx.config.http.max_speech_batch_items
    if len(body.items) > limit:
        raise ApiError(
            f"Invalid value for 'items': at most {limit} items are allowed.", param="items", code=INVALID_VALUE
        )
    tts = require_tts(ctx, body.model)
    batch_id = f"speechbatch-{uuid.uuid4().hex}"
    return await run_generation(request, batch_id, functools.partial(_speak_all, request, tts, body, batch_id))


@dataclass
class _AudioBudget:
    """24 kHz samples the rest of the batch may still produce (``http.max_speech_batch_s``)."""

    limit_s: float
    samples_left: int

    def spend(self, samples: int) -> None:
        self.samples_left -= samples
        if self.samples_left < 0:
            raise EngineError(
                f"the batch's audio is longer than http.max_speech_batch_s ({self.limit_s:g} s)",
                code=SPEECH_TOO_LONG,
                param="input",
            )


async def _speak_all(
    request: web.Request, tts: TTSEngine, body: SpeechBatchRequest, batch_id: str
) -> web.StreamResponse:
    defaults = {"voice": body.voice, "response_format": body.response_format, "speed": body.speed}
    limit_s = request.app[CTX].config.http.max_speech_batch_s
    budget = _AudioBudget(limit_s, math.floor(limit_s * SPEECH_SAMPLE_RATE))
    results = [
        await _speak_one(request, tts, index, {**defaults, **item}, budget) for index, item in enumerate(body.items)
    ]
    succeeded = sum(1 for r in results if r["status"] == "success")
    return web.json_response(
        {
            "id": batch_id,
            "results": results,
            "total": len(results),
            "succeeded": succeeded,
            "failed": len(results) - succeeded,
        }
    )


async def _speak_one(
    request: web.Request, tts: TTSEngine, index: int, fields: dict[str, Any], budget: _AudioBudget
) -> dict[str, Any]:
    config = request.app[CTX].config.http
    try:
        try:
            item = SpeechRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            raise validation_error(exc) from None
        if len(item.input) > config.max_speech_input_chars:
            raise ApiError(
                f"Invalid value for 'input': at most {config.max_speech_input_chars} characters are allowed.",
                param="input",
                code=INVALID_VALUE,
            )
        budget.spend(0)  # a batch already past its bound speaks no further item
        audio, samples = await _synthesize(request, tts, item, budget)
    except (ApiError, EngineError) as exc:
        error = api_error(exc).body()["error"]
        if error.get("param"):
            error["param"] = f"items[{index}].{error['param']}"
        return {"index": index, "status": "error", "error": error}
    return {
        "index": index,
        "status": "success",
        "audio_data": base64.b64encode(audio).decode(),
        "media_type": CONTENT_TYPES[item.response_format],
        "usage": {"input_characters": len(item.input), "output_samples": samples},
    }


async def _synthesize(
    request: web.Request, tts: TTSEngine, item: SpeechRequest, budget: _AudioBudget
) -> tuple[bytes, int]:
    """The whole encoded file and its length in 24 kHz samples; stops once over ``budget``."""
    pipeline = SpeechPipeline(request.app[CTX].codecs, tts.sample_rate, item.response_format)
    parts: list[bytes] = []
    async with contextlib.aclosing(tts.synthesize(item.input, voice=item.voice_name, speed=item.speed)) as chunks:
        async for pcm in chunks:
            before = pipeline.samples_out
            parts.append(await pipeline.encode(pcm))
            budget.spend(pipeline.samples_out - before)
    before = pipeline.samples_out
    parts.append(await pipeline.finish())
    budget.spend(pipeline.samples_out - before)
    return b"".join(parts), pipeline.samples_out


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech/batch", create_speech_batch)
