"""``/health`` for an address several front-ends serve (``--workers N`` on one port).

The kernel hands each new connection to any of the workers, so a 200 from one of them says
nothing of the next connection unless every worker serves: after an engine restart each worker
reconnects its own link, and until the last one has, some of the new sessions are refused with
``engine_unavailable``. So a worker that is ready itself asks its neighbours (their peer sites,
``HEALTH_ROUTE``) and answers with the first one that is not, naming it (``front_end``). A
neighbour that drains is not counted: it refuses new sessions so that clients try again (and
land on another worker), and it leaves; the address stays in rotation.

A neighbour that refuses the connection is gone (a worker that died leaves its socket behind;
its replacement has its own); one that does not answer within ``peers.health_timeout_s`` is left
out with a warning, so one stalled worker does not take the address out of rotation by itself;
so is the whole check when the directory cannot list them (a cluster's directory actor gone).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from rtserve.web.base_routes import Health
from rtserve.web.peers import signing
from rtserve.web.peers.directory import PeerAddress
from rtserve.web.peers.relay import Peers

log = logging.getLogger(__name__)

HEALTH_ROUTE = "/_rtserve/health"


async def neighbours_health(peers: Peers) -> Health | None:
    """The first neighbour's answer that is not a 200 (``front_end`` added); None when all serve."""
    try:
        neighbours = await asyncio.wait_for(peers.directory.neighbours(peers.tag), peers.settings.health_timeout_s)
    except Exception as exc:  # noqa: BLE001 - a directory actor gone (any Ray error): answer for this one alone
        log.warning("front-end directory did not list the neighbours for a health check: %r", exc)
        return None
    answers = await asyncio.gather(*(_ask(peers, tag, address) for tag, address in neighbours.items()))
    for tag, answer in zip(neighbours, answers, strict=True):
        if answer is not None and answer[1] != 200 and answer[0].get("status") != "draining":
            body, status = answer
            return {**body, "front_end": tag}, status
    return None


async def _ask(peers: Peers, tag: str, address: PeerAddress) -> Health | None:
    connector = aiohttp.UnixConnector(address.path) if address.path is not None else aiohttp.TCPConnector()
    headers = {signing.HEADER: peers.signer.sign("GET", HEALTH_ROUTE)} if peers.signer is not None else {}
    timeout = aiohttp.ClientTimeout(total=peers.settings.health_timeout_s)
    try:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
            http.get(address.base_url + HEALTH_ROUTE, headers=headers) as response,
        ):
            body = await response.json()
            return (body, response.status) if isinstance(body, dict) else None
    except TimeoutError:  # before the connection errors: aiohttp's timeouts are both
        log.warning("front-end %s did not answer a health check within %g s", tag, peers.settings.health_timeout_s)
    except (aiohttp.ClientConnectionError, OSError):
        pass  # gone: its share of the port is closed or handed to its replacement
    except (aiohttp.ClientError, ValueError) as exc:
        log.warning("front-end %s answered a health check with no health: %r", tag, exc)
    return None
