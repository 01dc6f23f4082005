"""A server installed without the ``media`` extra (diffusers, aiosqlite) starts and serves: only a
server with image or video routes needs those packages. Found when ``--workers 8`` on a GPU host
without aiosqlite failed every worker at import."""

from __future__ import annotations

import subprocess
import sys

SERVE_WITHOUT_MEDIA = """
import sys
for name in ("aiosqlite", "diffusers"):
    sys.modules[name] = None  # import fails as if the package were not installed
import asyncio
from aiohttp.test_utils import TestClient, TestServer
from rtserve.app import build_app
from rtserve.config import ServerConfig

async def main():
    async with TestClient(TestServer(build_app(ServerConfig(engine="loopback")))) as client:
        response = await client.get("/v1/models")
        print(response.status)

asyncio.run(main())
"""


def test_the_server_starts_and_answers_without_the_media_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVE_WITHOUT_MEDIA], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "200"
