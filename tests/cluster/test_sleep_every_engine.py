"""Sleep mode through a cluster front-end goes to every reachable engine (two engines behind
the TCP link, no Ray). The loopback engine has no stages to unload, so each engine refuses:
the refusal is the client's answer while any engine is reachable; with none, the engine is
unavailable. (Stages put to sleep and woken on two engine actors: ``test_ray_http``.)
"""

from __future__ import annotations

import aiohttp

from rtserve.config import ServerConfig
from tests.cluster.clients import eventually
from tests.cluster.test_admission import front_end


async def sleep_error_code(http: aiohttp.ClientSession, base: str) -> str:
    async with http.post(f"{base}/v1/omni/sleep", json={"level": 1}) as response:
        return str((await response.json())["error"]["code"])


async def test_sleep_is_refused_by_every_reachable_engine_then_unavailable_with_none(config: ServerConfig) -> None:
    config.enable_sleep_mode = True
    async with front_end(config) as (base, cluster, engines), aiohttp.ClientSession() as http:
        assert await sleep_error_code(http, base) == "sleep_unsupported"
        assert cluster.sleeping == ()
        await engines[1].kill()
        await eventually(lambda: not cluster.members[1].reachable, what="engine 1 to be lost")
        assert await sleep_error_code(http, base) == "sleep_unsupported"  # engine 0 still answers
        await engines[0].kill()
        await eventually(lambda: not cluster.members[0].reachable, what="engine 0 to be lost")
        assert await sleep_error_code(http, base) == "engine_unavailable"
        async with http.get(f"{base}/health") as response:
            assert response.status == 503
