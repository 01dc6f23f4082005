"""``POST /v1/omni/sleep`` and ``POST /v1/omni/wakeup`` (docs/serving.md#sleep-mode), with ``--enable-sleep-mode``.

Sleep: ``{"stage_ids": [0], "level": 1}`` (both optional: every stage, level 1) -> 200
``{"status": "SUCCESS", ..., "freed_bytes": N, "acks": [...]}``. Wake: ``{"stage_ids": [0]}``
-> 200 with ``restored_bytes``; stages already awake give no ack (a repeated wake is a
no-op); after a level-2 sleep, 501 whose message says ``sleep(level=2)`` is ``not yet
implemented``. While any stage sleeps, new requests and sessions are refused with 503 /
an ``engine_sleeping`` error. The engine (``engines/sleep.py``) does the work; with
``--workers N`` it runs in the engine process and every worker learns the sleeping set.
Without the flag both routes answer 404 ``sleep_mode_disabled``.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from rtserve.errors import SLEEP_MODE_DISABLED
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.common import engine_errors, read_json


class SleepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage_ids: list[StrictInt] | None = Field(None, min_length=1)
    level: StrictInt = Field(1, ge=1, le=2)  # strict: JSON true is not level 1


class WakeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage_ids: list[StrictInt] | None = Field(None, min_length=1)


def _require_enabled(request: web.Request) -> None:
    if not request.app[CTX].config.enable_sleep_mode:
        raise ApiError(
            "Sleep mode is not enabled; start the server with --enable-sleep-mode.",
            status=404,
            code=SLEEP_MODE_DISABLED,
        )


async def sleep(request: web.Request) -> web.Response:
    _require_enabled(request)
    body = await read_json(request, SleepRequest)
    engines = request.app[CTX].engines
    with engine_errors():
        acks = await engines.sleep(body.stage_ids, body.level)
    return web.json_response(
        {
            "status": "SUCCESS",
            "level": body.level,
            "stage_ids": [a["stage_id"] for a in acks],
            "sleeping_stages": list(engines.sleeping),
            "freed_bytes": sum(a["freed_bytes"] for a in acks),
            "acks": acks,
        }
    )


async def wakeup(request: web.Request) -> web.Response:
    _require_enabled(request)
    body = await read_json(request, WakeRequest)
    engines = request.app[CTX].engines
    with engine_errors():
        acks = await engines.wake_up(body.stage_ids)
    return web.json_response(
        {
            "status": "SUCCESS",
            "stage_ids": [a["stage_id"] for a in acks],
            "sleeping_stages": list(engines.sleeping),
            "restored_bytes": sum(a["restored_bytes"] for a in acks),
            "acks": acks,
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/omni/sleep", sleep)
    app.router.add_post("/v1/omni/wakeup", wakeup)
