"""Plumbing shared by the HTTP generation routes (chat, speech, transcriptions).

* request bodies -> pydantic models, with OpenAI-shaped 400s that name the ``param``;
* the engine a route needs, or a typed 503/404 (not loaded, still loading, unknown model);
  a request's ``model`` is the served model's name or an alias of its task
  (``http.model_aliases``: OpenAI's names by default);
* body bounds: JSON bodies (``http.max_json_body_bytes``) far below uploads, both judged
  from Content-Length and while reading, and read within a deadline (408 beyond);
* the concurrency limit: a generation beyond it is refused with 429, never queued, before
  its body is read;
* client-disconnect cancellation: the generation task (and the engine iterator it holds)
  is cancelled as soon as the client goes away;
* Server-Sent Events framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from aiohttp import BodyPartReader, web
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ValidationError

from rtserve import untrusted_json
from rtserve.config import ModelTask
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import ASREngine, LLMEngine, TTSEngine
from rtserve.errors import (
    ENGINE_FAILED,
    ENGINE_SLEEPING,
    INVALID_JSON,
    INVALID_REQUEST_ERROR,
    INVALID_VALUE,
    MISSING_PARAMETER,
    MODEL_NOT_FOUND,
    MODEL_NOT_READY,
    RATE_LIMIT_EXCEEDED,
    REQUEST_TIMEOUT,
    REQUEST_TOO_LARGE,
    TASK_UNAVAILABLE,
)
from rtserve.log import session_id_var
from rtserve.web.context import CTX, AppContext
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=BaseModel)
ItemT = TypeVar("ItemT")

# ---------------------------------------------------------------------------
# Request parsing
# ---------------------------------------------------------------------------


def param_path(loc: tuple[int | str, ...]) -> str:
    """Pydantic location -> OpenAI ``param`` spelling: ``messages[0].content``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


# Union members and validators add their own names to an error's location.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "function-after", "literal"})


def validation_error(exc: ValidationError) -> ApiError:
    # A value failing a union (``str | list[TextPart]``) fails every member; the deepest
    # location is the one that tells the client what is wrong.
    err = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS)))
    param = param_path(loc) or None
    if err["type"] == "missing":
        return ApiError(f"Missing required parameter: '{param}'.", param=param, code=MISSING_PARAMETER)
    return ApiError(f"Invalid value for '{param}': {err['msg']}.", param=param, code=INVALID_VALUE)


def reject_oversized(request: web.Request, limit: int) -> None:
    """Refuse a body whose declared length is over the limit before reading any of it."""
    if request.content_length is not None and request.content_length > limit:
        raise body_too_large(limit)


def body_too_large(limit: int) -> ApiError:
    return ApiError(f"Request body exceeds the limit of {limit} bytes.", status=413, code=REQUEST_TOO_LARGE)


async def read_part(part: BodyPartReader, limit: int) -> bytes:
    """One multipart part's bytes, refused (413) as soon as they pass ``limit``, while they arrive."""
    data = bytearray()
    while chunk := await part.read_chunk():
        data += chunk
        if len(data) > limit:
            raise body_too_large(limit)
    return bytes(data)


@contextlib.asynccontextmanager
async def body_deadline(request: web.Request, limit: int) -> AsyncIterator[None]:
    """Bound the time a body may take to arrive: a base allowance plus its declared size (or,
    chunked, its limit) at the slowest upload rate served; a trickling client gets 408."""
    transport = request.app[CTX].config.transport
    size = request.content_length if request.content_length is not None else limit
    try:
        async with asyncio.timeout(transport.http_body_timeout_s + size / transport.http_body_min_bytes_per_s):
            yield
    except TimeoutError:
        raise ApiError(
            "The request body did not arrive in time.",
            status=408,
            code=REQUEST_TIMEOUT,
            type_=INVALID_REQUEST_ERROR,
        ) from None


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refused (413) from its declared length or once it grows past ``limit``."""
    reject_oversized(request, limit)
    chunks: list[bytes] = []
    size = 0
    async with body_deadline(request, limit):
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: web.Request, model: type[ModelT]) -> ModelT:
    return validate(model, await read_json_object(request))


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, not yet validated (a route whose shape depends on its fields)."""
    # A JSON request has its own bound, far below an upload's: parsing costs memory many times its size.
    config = request.app[CTX].config
    raw = await read_body(request, min(config.http.max_json_body_bytes, config.transport.max_http_body_bytes))
    try:
        data = untrusted_json.loads(raw)
    except ValueError:
        raise ApiError("The request body is not valid JSON.", code=INVALID_JSON) from None
    if not isinstance(data, dict):
        raise ApiError("The request body must be a JSON object.", code=INVALID_JSON)
    return data


def validate(model: type[ModelT], data: dict[str, Any]) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


# ---------------------------------------------------------------------------
# Which engine serves a request
# ---------------------------------------------------------------------------

_ModelNamed = TypeVar("_ModelNamed", ASREngine, LLMEngine, TTSEngine)

_TASK_NAMES: dict[ModelTask, str] = {
    "chat": "text generation",
    "transcription": "speech-to-text",
    "speech": "text-to-speech",
}


def require_llm(ctx: AppContext, model: str | None) -> LLMEngine:
    return _require(ctx, ctx.turn_engines.llm, "chat", model)


def require_asr(ctx: AppContext, model: str | None) -> ASREngine:
    return _require(ctx, ctx.turn_engines.asr, "transcription", model)


def require_tts(ctx: AppContext, model: str | None) -> TTSEngine:
    return _require(ctx, ctx.turn_engines.tts, "speech", model)


def _names_served_model(ctx: AppContext, task: ModelTask, model: str | None, served: str) -> bool:
    return model is None or model == served or ctx.config.http.model_aliases.get(model) == task


def _require(ctx: AppContext, engine: _ModelNamed | None, task: ModelTask, model: str | None) -> _ModelNamed:
    """The engine for a task; 503 when absent or not started, 404 when ``model`` names another."""
    task_name = _TASK_NAMES[task]
    if engine is None:
        raise ApiError(
            f"This server has no {task_name} model loaded (engine '{ctx.engine.capabilities.name}').",
            status=503,
            code=TASK_UNAVAILABLE,
        )
    if not _names_served_model(ctx, task, model, engine.model_name):
        raise ApiError(
            f"The model '{model}' does not exist; this server's {task_name} model is '{engine.model_name}'.",
            status=404,
            code=MODEL_NOT_FOUND,
            param="model",
        )
    if ctx.engines.sleeping:
        raise engine_sleeping()
    if not ctx.engine.ready:
        raise not_serving(ctx.engine.capabilities.name, failed=bool(ctx.engine_failure))
    return engine


def not_serving(engine: str, *, failed: bool) -> ApiError:
    """The 503 of a route whose engine (named ``engine``) does not serve: ``engine_failed`` for
    good after a failed load (the reason stays in the server log), else ``model_not_ready``
    with Retry-After while it loads."""
    if failed:
        return ApiError(f"The {engine} engine failed to load; see the server log.", status=503, code=ENGINE_FAILED)
    return ApiError(
        f"The {engine} engine is still loading; retry shortly.",
        status=503,
        code=MODEL_NOT_READY,
        headers={"Retry-After": "5"},
    )


def engine_sleeping() -> ApiError:
    """Sleep mode unloaded the models: refused at once, never queued until a wake."""
    return ApiError(
        "The engine is asleep (sleep mode); POST /v1/omni/wakeup to wake it.", status=503, code=ENGINE_SLEEPING
    )


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """Turn an ``EngineError`` raised before the response started into an HTTP error."""
    try:
        yield
    except EngineError as exc:
        raise api_error(exc) from None


async def first_item(items: AsyncIterator[ItemT]) -> ItemT | None:
    """Pull the first item before any header goes out, so early failures get a real status."""
    with engine_errors():
        try:
            return await anext(items)
        except StopAsyncIteration:
            return None


# ---------------------------------------------------------------------------
# Concurrency limit and client disconnect
# ---------------------------------------------------------------------------


class GenerationLimiter:
    """At most ``limit`` HTTP generations at once; the next one gets 429 at once."""

    def __init__(self, limit: int, registry: CollectorRegistry) -> None:
        self.limit = limit
        self._in_flight = 0
        self._gauge = Gauge("rtserve_http_generations_in_flight", "HTTP generations running now", registry=registry)
        self._rejected = Counter(
            "rtserve_http_generations_rejected", "HTTP generations refused with 429", registry=registry
        )

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        if self._in_flight >= self.limit:
            self._rejected.inc()
            raise ApiError(
                f"Too many concurrent generations (limit {self.limit}); retry shortly.",
                status=429,
                code=RATE_LIMIT_EXCEEDED,
                headers={"Retry-After": "1"},
            )
        self._in_flight += 1
        self._gauge.set(self._in_flight)
        try:
            yield
        finally:
            self._in_flight -= 1
            self._gauge.set(self._in_flight)


LIMITER = web.AppKey("http_generation_limiter", GenerationLimiter)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def generation_route(handler: Handler) -> Handler:
    """Hold a concurrency slot for the whole request, taken before its body is read: a refused
    request costs no reading or parsing (a slow body holds its slot only until ``body_deadline``)."""

    @functools.wraps(handler)
    async def route(request: web.Request) -> web.StreamResponse:
        with request.app[LIMITER].slot():
            return await handler(request)

    return route


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def run_generation(
    request: web.Request, request_id: str, work: Callable[[], Coroutine[Any, Any, web.StreamResponse]]
) -> web.StreamResponse:
    """Run ``work()`` (inside a ``generation_route``); cancel it if the client disconnects.

    aiohttp does not cancel handlers when a client goes away, so a generation would run to
    the end for nobody. Cancelling the task raises inside the engine iterator it awaits,
    which closes it (and frees the engine's slot) at once.
    """
    ctx = request.app[CTX]
    session_id_var.set(request_id)  # copied into the task: every log line of this generation is tagged
    task = asyncio.ensure_future(work())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=ctx.config.http.disconnect_poll_s)
            if not task.done() and client_gone(request):
                task.cancel()
                break
        try:
            return await task
        except (asyncio.CancelledError, ConnectionError):
            handler_task = asyncio.current_task()  # never None inside a coroutine
            if handler_task is not None and handler_task.cancelling():  # the server itself is stopping
                raise
            log.info("client disconnected; generation cancelled")
            return web.Response(status=499)  # never reaches anyone; keeps the access log honest
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------------
# Server-Sent Events
# ---------------------------------------------------------------------------


class SseStream:
    """``data: <json>\\n\\n`` events on a chunked ``text/event-stream`` response."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # tell reverse proxies not to hold events back
            }
        )

    async def start(self) -> None:
        await self.response.prepare(self._request)

    async def send(self, event: dict[str, Any]) -> None:
        await self.response.write(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")

    async def send_done_marker(self) -> None:
        await self.response.write(b"data: [DONE]\n\n")

    async def finish(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response
