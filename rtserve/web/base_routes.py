"""Readiness, model list and Prometheus metrics."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rtserve.errors import ENGINE_FAILED
from rtserve.web.context import CTX
from rtserve.web.route_engine import RouteEngine, route_engines


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    if ctx.sessions.draining:  # a load balancer takes this front-end out of rotation
        return web.json_response({"status": "draining"}, status=503)
    if ctx.engines.sleeping:  # deliberately: 200, so a liveness probe does not restart it (docs/serving.md#sleep-mode)
        return web.json_response({"status": "sleeping", "sleeping_stages": list(ctx.engines.sleeping)})
    # The routes' own engines (images, videos, the Kyutai streaming routes) count as the
    # session engine does: "ok" only once every configured engine serves.
    owned = route_engines(request.app)
    states = {name: _state(engine) for name, engine in owned.items()}
    listed = {"route_engines": states} if states else {}
    if ctx.engines.ready and all(state == "ready" for state in states.values()):  # and vLLM where chat uses it
        return web.json_response({"status": "ok", **listed})
    if ctx.engine_failure or "failed" in states.values():  # the reason stays in the log: it may name paths
        return web.json_response(
            {
                "status": "failed",
                "code": ENGINE_FAILED,
                "error": "An engine is not serving; the server log says why",
                **listed,
            },
            status=503,
        )
    if (download := ctx.engines.downloading) is not None:  # docs/engines.md#hub-weights
        return web.json_response(
            {
                "status": "downloading",
                "fraction": round(download.fraction, 4),
                "bytes_done": download.done,
                "bytes_total": download.total,
                **listed,
            },
            status=503,
        )
    return web.json_response({"status": "starting", **listed}, status=503)


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
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"id": mid, "object": "model", "created": created, "owned_by": "rtserve"}
                for mid in dict.fromkeys(served)
            ],
        }
    )


async def metrics(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    body = await ctx.engines.exposition(generate_latest(ctx.registry))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup(app: web.Application) -> None:
    app[CTX].started_at = app[CTX].started_at or time.time()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
