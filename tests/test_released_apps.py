"""An app the tests served and stopped is freed with everything it holds (engines, models) once
``release_middleware_cache`` has run, as the suite's autouse fixture does after each module:
aiohttp's cache of middleware chains otherwise keeps every app a process served alive."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from tests.support import release_middleware_cache, serve_plain

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def passthrough(request: web.Request, handler: Handler) -> web.StreamResponse:
    return await handler(request)


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


@pytest.mark.asyncio
async def test_a_served_app_is_freed_once_the_middleware_cache_is_released() -> None:
    served = web.Application(middlewares=[passthrough])
    served.router.add_get("/", hello)
    async with serve_plain(served) as base, aiohttp.ClientSession() as http, http.get(base) as response:
        assert await response.text() == "hello"
    alive = weakref.ref(served)
    del served
    release_middleware_cache()
    gc.collect()
    assert alive() is None
