"""Registers ``POST /v1/realtime/calls``, ``POST /v1/realtime/calls/{call_id}/hangup`` and
``POST /v1/realtime/client_secrets`` (OpenAI's WebRTC and browser-key routes)."""

from __future__ import annotations

import secrets

from aiohttp import web

from rtserve import errors, untrusted_json
from rtserve.sessions.events import SessionCreated, SessionSnapshot
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.common import read_body
from rtserve.web.realtime.routes import SERVICE as REALTIME
from rtserve.web.webrtc.client_secrets import CALLS_ROUTE, ClientSecrets
from rtserve.web.webrtc.ice import use_host_addresses
from rtserve.web.webrtc.metrics import WebRtcMetrics
from rtserve.web.webrtc.offer import read_offer
from rtserve.web.webrtc.projection import WebRtcProjection
from rtserve.web.webrtc.service import WebRtcService
from rtserve.web.webrtc.session_config import call_config

SERVICE = web.AppKey("webrtc", WebRtcService)
SECRETS = web.AppKey("client_secrets", ClientSecrets)


async def _create_call(request: web.Request) -> web.Response:
    offer = await read_offer(request)
    secret = request.app[SECRETS].presented(request)
    call = await request.app[SERVICE].place(offer, secret.session if secret is not None else None)
    return web.Response(
        status=201,
        text=call.pc.localDescription.sdp,
        content_type="application/sdp",
        headers={"Location": f"{CALLS_ROUTE}/{call.call_id}"},
    )


async def _hangup(request: web.Request) -> web.Response:
    await request.app[SERVICE].get(request.match_info["call_id"]).end("hangup")
    return web.Response(status=200)


async def _client_secret(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    raw = await read_body(request, min(ctx.config.http.max_json_body_bytes, ctx.config.transport.max_http_body_bytes))
    try:
        body = untrusted_json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise ApiError("The request body is not valid JSON.", code=errors.INVALID_JSON) from None
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.", code=errors.INVALID_JSON)
    session = body.get("session")
    # Validate now: a secret bound to a session no call could open would only fail later, in the browser.
    config = call_config([session if isinstance(session, dict) else None], ctx.engine.capabilities, ctx.config.sessions)
    secret = request.app[SECRETS].mint(body)
    snapshot = SessionSnapshot(
        id=f"sess_{secrets.token_hex(12)}",
        config=config,
        capabilities={"engine": ctx.config.engine},
        epoch=0,
        turn_id=0,
        resumable=False,
    )
    rendered = WebRtcProjection().render(SessionCreated(session_id=snapshot.id, session=snapshot))["session"]
    return web.json_response({"value": secret.value, "expires_at": secret.expires_at, "session": rendered})


async def _on_shutdown(app: web.Application) -> None:
    await app[SERVICE].shutdown()


def setup(app: web.Application, client_secrets: ClientSecrets) -> None:
    """After ``realtime.setup``: calls run on the realtime routes' service."""
    ctx = app[CTX]
    use_host_addresses(ctx.config.webrtc.host_addresses)
    app[SECRETS] = client_secrets
    app[SERVICE] = WebRtcService(ctx.config, app[REALTIME], WebRtcMetrics(ctx.registry))
    app.router.add_post(CALLS_ROUTE, _create_call)
    app.router.add_post(CALLS_ROUTE + "/{call_id}/hangup", _hangup)
    app.router.add_post("/v1/realtime/client_secrets", _client_secret)
    app.on_shutdown.append(_on_shutdown)
