"""Registers ``WS /v1/realtime/robot/openpi`` and openpi's ``GET /healthz``.

Upstream's ``WebsocketPolicyServer`` answers at any path, and openpi-client's
``WebsocketClientPolicy(host, port)`` connects to ``/``: a WebSocket upgrade at ``/`` is
the robot route too (``web/browser`` owns ``/`` and hands upgrades to ``openpi_socket``;
a plain ``GET /`` is the browser page).

The policy and its batcher are built and run by the app (``AppContext.policy_batcher``);
a connection waits for the policy to finish loading, and is refused with an error frame
and 1011 when there is none.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import WSCloseCode, web

from rtserve.engines.errors import EngineError
from rtserve.errors import NO_POLICY
from rtserve.log import session_id_var
from rtserve.web.connections import Connections, close_socket
from rtserve.web.context import CTX
from rtserve.web.error_mapping import openpi_error_frame
from rtserve.web.openpi.connection import OpenPIConnection
from rtserve.web.openpi.metrics import OpenPIMetrics
from rtserve.web.openpi.wire import pack_message
from rtserve.web.subprotocols import key_subprotocols

ROUTE = "/v1/realtime/robot/openpi"


@dataclass(frozen=True)
class OpenPIService:
    metrics: OpenPIMetrics
    connections: Connections


OPENPI = web.AppKey("openpi", OpenPIService)


async def openpi_socket(request: web.Request) -> web.WebSocketResponse:
    ctx = request.app[CTX]
    service = request.app[OPENPI]
    robot = ctx.config.robot
    ws = web.WebSocketResponse(
        protocols=key_subprotocols(request),
        max_msg_size=robot.max_message_bytes,
        heartbeat=ctx.config.transport.ws_heartbeat_s,
        compress=False,
    )
    await ws.prepare(request)
    batcher = await ctx.policy_batcher()
    if batcher is None:
        service.metrics.errors.labels("unavailable").inc()
        unavailable = EngineError("Robot policy not available", code=NO_POLICY)
        await ws.send_bytes(pack_message(openpi_error_frame(unavailable)))
        await close_socket(ws, WSCloseCode.INTERNAL_ERROR, "robot policy not available")
        return ws
    connection = OpenPIConnection(ws, batcher, service.metrics, ctx.codecs, robot.idle_timeout_s)
    token = session_id_var.set(f"openpi-{connection.connection_id}")
    service.metrics.connections.inc()
    try:
        async with service.connections.track(ws):  # a failure concerns this robot only
            await connection.run()
    finally:
        service.metrics.connections.dec()
        session_id_var.reset(token)
    return ws


async def healthz(request: web.Request) -> web.Response:
    """openpi's liveness probe: plain 200 while the process serves HTTP."""
    return web.Response(text="OK")


async def _on_shutdown(app: web.Application) -> None:
    await app[OPENPI].connections.close_all()


def setup(app: web.Application) -> None:
    ctx = app[CTX]
    connections = Connections("openpi", ctx.config.sessions.shutdown_timeout_s)
    app[OPENPI] = OpenPIService(OpenPIMetrics(ctx.registry), connections)
    app.router.add_get(ROUTE, openpi_socket)
    app.router.add_get("/healthz", healthz)
    app.on_shutdown.append(_on_shutdown)
