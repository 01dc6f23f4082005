"""``GET /``, ``GET /dashboard`` and ``GET /static/*`` over a real socket (no browser): every
file the pages load is served, nothing outside the package is reachable, nothing external is
referenced, the pages are public while everything they call keeps needing the key, and a
WebSocket upgrade at ``/`` is still the openpi robot route."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import aiohttp
import pytest

from rtserve.config import ServerConfig
from rtserve.web.browser.routes import STATIC_DIR
from tests.web.realtime_support import loopback_config, running, ws_url

ROOT = Path(__file__).resolve().parents[3]
# Every way the pages name another file: HTML src/href, ES module imports, addModule(), fetch().
REFERENCE = re.compile(r"""(?:src|href)="([^"]+)"|from\s+"([^"]+)"|addModule\("([^"]+)"\)|fetch\("([^"]+)\"""")


def references() -> set[str]:
    found: set[str] = set()
    for path in STATIC_DIR.iterdir():
        for groups in REFERENCE.findall(path.read_text()):
            found.update(g for g in groups if g)
    return found


def as_served_path(reference: str) -> str:
    return "/static/" + reference[2:] if reference.startswith("./") else reference


def test_the_pages_reference_only_this_server() -> None:
    refs = references()
    assert {"/static/page.js", "/static/dashboard.js", "/static/pcm-worklet.js", "./pcm-stream.js"} <= refs
    external = [r for r in refs if not (r.startswith(("/", "./", "data:")))]
    assert external == []


def test_every_static_file_ships_in_the_wheel() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rtserve"]
    for path in STATIC_DIR.rglob("*"):
        relative = path.relative_to(ROOT / "rtserve").as_posix()
        assert path.is_file() and any(fnmatch.fnmatch(relative, g) for g in globs), relative


async def test_pages_and_every_file_they_load_are_served(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        for path in ("/", "/dashboard"):
            async with http.get(base + path) as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
                assert '<script type="module"' in await resp.text()
        for ref in references():
            if ref.startswith("data:") or ref in ("/", "/dashboard", "/metrics"):
                continue  # not a file, a page, or the API the dashboard reads
            async with http.get(base + as_served_path(ref)) as resp:
                assert resp.status == 200, ref
                kind = resp.content_type
                assert kind in ("text/javascript", "application/javascript", "text/css"), (ref, kind)
                assert "Content-Security-Policy" in resp.headers
        for missing in ("/static/nope.js", "/static/..%2Fbrowser%2Froutes.py", "/static/", "/dashboard/x"):
            async with http.get(base + missing) as resp:
                assert resp.status == 404, missing


async def test_with_an_api_key_the_pages_are_public_and_what_they_call_is_not(config: ServerConfig) -> None:
    config.api_key = "sk-routes"
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        for path in ("/", "/dashboard", "/static/page.js"):
            async with http.get(base + path) as resp:
                assert resp.status == 200, path
        async with http.get(base + "/metrics") as resp:
            assert resp.status == 401
        async with http.post(base + "/") as resp:
            assert resp.status == 401
        async with http.ws_connect(ws_url(base, "/")) as ws:  # the robot route at "/" still needs the key
            await ws.receive(timeout=5)
            assert ws.close_code == 4001


@pytest.mark.parametrize("path", ["/", "/v1/realtime/robot/openpi"])
async def test_a_websocket_upgrade_at_root_is_still_the_robot_route(config: ServerConfig, path: str) -> None:
    # No policy: the robot route answers its typed refusal (a MessagePack error frame, then
    # 1011), which only the robot route sends: the page did not take the upgrade.
    config.robot.policy = "none"
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, path)) as ws:
            frame = await ws.receive(timeout=5)
            assert frame.type == aiohttp.WSMsgType.BINARY
            await ws.receive(timeout=5)
            assert ws.close_code == 1011
