"""The private site a front-end serves its peers on, beside its public one.

Routes: the realtime routes (a peer relaying a client's socket to the session's owner),
``POST /_rtserve/drain`` (``rtserve drain --front-end``) and ``GET /_rtserve/health`` (this
front-end's own readiness, for a neighbour's ``/health``: ``health.py``). Over TCP every request must be
signed with the cluster secret (``signing.py``); over a Unix socket in the supervisor's 0700
folder the file system is the check. The public middlewares (API key) already ran on the
front-end that relays: the client proved itself there.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from rtserve.errors import INVALID_JSON, INVALID_VALUE, PEER_UNAUTHORIZED
from rtserve.web.base_routes import NEIGHBOURS_HEALTH, own_health
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError, error_middleware
from rtserve.web.peers import signing
from rtserve.web.peers.drain import FrontEndDrain
from rtserve.web.peers.health import HEALTH_ROUTE, neighbours_health
from rtserve.web.peers.relay import Peers
from rtserve.web.realtime.dialect import DUPLEX_ROUTE, REALTIME_ROUTE
from rtserve.web.realtime.service import RealtimeService
from rtserve.web.runner import app_runner

log = logging.getLogger(__name__)

DRAIN_ROUTE = "/_rtserve/drain"
PEERS = web.AppKey("peers", Peers)
_RUNNER = web.AppKey("peer_runner", web.AppRunner)


def _peer_app(public: web.Application, peers: Peers, service: RealtimeService, drain: FrontEndDrain) -> web.Application:
    @web.middleware
    async def signed_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if peers.signer is not None and not peers.signer.verify(
            request.headers.get(signing.HEADER), request.method, request.path_qs
        ):
            log.warning("peer request from %s refused: not signed with the cluster secret", request.remote)
            raise ApiError("Not a front-end of this cluster", status=403, code=PEER_UNAUTHORIZED)
        return await handler(request)

    async def realtime(request: web.Request) -> web.StreamResponse:
        return await service.handle(request, REALTIME_ROUTE)

    async def duplex(request: web.Request) -> web.StreamResponse:
        return await service.handle(request, DUPLEX_ROUTE)

    async def drain_route(request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            raise ApiError("The body is not JSON", code=INVALID_JSON) from None
        deadline = body.get("deadline_s") if isinstance(body, dict) else None
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0
        ):
            raise ApiError("deadline_s must be a positive number of seconds", param="deadline_s", code=INVALID_VALUE)
        return web.json_response(await drain(deadline), status=202)

    async def health(request: web.Request) -> web.Response:
        body, status = own_health(public)  # the public app's: its route engines are registered there
        return web.json_response(body, status=status)

    app = web.Application(middlewares=[error_middleware, signed_only])
    app.router.add_get(REALTIME_ROUTE, realtime)
    app.router.add_get(DUPLEX_ROUTE, duplex)
    app.router.add_post(DRAIN_ROUTE, drain_route)
    app.router.add_get(HEALTH_ROUTE, health)
    return app


def setup(app: web.Application, peers: Peers, service: RealtimeService, drain: FrontEndDrain) -> None:
    """Serve ``app``'s peers from its startup to its cleanup."""
    app[PEERS] = peers
    peers.serve_app(app[CTX].registry, service.config.transport.ws_heartbeat_s)
    service.peers = peers
    app[NEIGHBOURS_HEALTH] = lambda: neighbours_health(peers)

    async def start(app: web.Application) -> None:
        peer_app = _peer_app(app, peers, service, drain)
        peer_app[CTX] = app[CTX]
        runner = app_runner(peer_app)
        await runner.setup()
        site = peers.directory.site(runner, peers.tag)
        await site.start()
        app[_RUNNER] = runner
        await peers.directory.publish(peers.tag, runner)
        log.info("front-end %s serves its peers on %s", peers.tag, site.name)

    async def stop(app: web.Application) -> None:
        drain.cancel()
        try:
            await peers.directory.withdraw(peers.tag)
        except Exception:  # the directory itself gone (the cluster down): nothing left to tell
            log.warning("front-end %s could not withdraw from the directory", peers.tag, exc_info=True)
        if _RUNNER in app:
            await app[_RUNNER].cleanup()

    app.on_startup.append(start)
    app.on_cleanup.insert(0, stop)
