"""Readiness, model list and Prometheus metrics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import CountsTokens
from rtserve.errors import ENGINE_FAILED
from rtserve.web.context import CTX
from rtserve.web.route_engine import RouteEngine, route_engines

Health = tuple[dict[str, object], int]  # the body and HTTP status /health answers
# Set where this front-end shares its address with others (``--workers N``): the first of them not ready, or None.
NEIGHBOURS_HEALTH = web.AppKey[Callable[[], Awaitable[Health | None]]]("neighbours_health")


async def health(request: web.Request) -> web.Response:
    """This front-end's readiness and, on a host of several workers, theirs too: the kernel hands
    any of them the next connection, so the address is ready only once every one serves."""
    body, status = own_health(request.app)
    neighbours = request.app.get(NEIGHBOURS_HEALTH)
    if status == 200 and neighbours is not None and (unready := await neighbours()) is not None:
        body, status = unready
    return web.json_response(body, status=status)


def own_health(app: web.Application) -> Health:
    ctx = app[CTX]
    if ctx.sessions.draining:  # a load balancer takes this front-end out of rotation
        return {"status": "draining"}, 503
    if ctx.engines.sleeping:  # deliberately: 200, so a liveness probe does not restart it (docs/serving.md#sleep-mode)
        return {"status": "sleeping", "sleeping_stages": list(ctx.engines.sleeping)}, 200
    # The routes' own engines (images, videos, the Kyutai streaming routes) count as the
    # session engine does: "ok" only once every configured engine serves.
    owned = route_engines(app)
    states = {name: _state(engine) for name, engine in owned.items()}
    listed = {"route_engines": states} if states else {}
    # Failed before ready: an engine beside the session engine (a Kyutai TTS or STT engine whose
    # routes the session engine does not use) may have failed while the session engine serves.
    if ctx.engine_failure or "failed" in states.values():  # the reason stays in the log: it may name paths
        return {
            "status": "failed",
            "code": ENGINE_FAILED,
            "error": "An engine is not serving; the server log says why",
            **listed,
        }, 503
    if ctx.engines.ready and all(state == "ready" for state in states.values()):  # and vLLM where chat uses it
        return {"status": "ok", **listed}, 200
    if (download := ctx.engines.downloading) is not None:  # docs/engines.md#hub-weights
        return {
            "status": "downloading",
            "fraction": round(download.fraction, 4),
            "bytes_done": download.done,
            "bytes_total": download.total,
            **listed,
        }, 503
    return {"status": "starting", **listed}, 503


def _state(engine: RouteEngine) -> str:
    if engine.ready:
        return "ready"
    return "failed" if engine.failure else "loading"


async def models(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    created = int(ctx.started_at)
    turn = ctx.turn_engines
    # The HTTP routes' engines too: a separate text engine (vLLM) is not the session engine's.
    served = [*ctx.engine.model_ids(), *(e.model_name for e in (turn.asr, turn.llm, turn.tts) if e is not None)]
    listed = {mid: {"id": mid, "object": "model", "created": created, "owned_by": "rtserve"} for mid in served}
    if isinstance(turn.llm, CountsTokens):  # vLLM's field, which its clients read (docs/serving.md#tokenize)
        with contextlib.suppress(EngineError):  # the engine process is gone: listed without it
            if context := await turn.llm.context_tokens():
                listed[turn.llm.model_name]["max_model_len"] = context
    return web.json_response({"object": "list", "data": list(listed.values())})


async def metrics(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    body = await ctx.engines.exposition(generate_latest(ctx.registry))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup(app: web.Application) -> None:
    app[CTX].started_at = app[CTX].started_at or time.time()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
