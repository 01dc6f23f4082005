"""/health readiness, /v1/models, /metrics, API-key auth and error bodies over a real socket."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence

import aiohttp
import pytest

from rtserve.app import build_app
from rtserve.engines.protocols import SleepStage, TurnEngines
from rtserve.engines.values import EngineCapabilities
from rtserve.web.route_engine import run_with_app
from tests.support import serve_app


class GatedStartEngine:
    """Test double: a SessionEngine whose start() waits until the test opens the gate,
    so readiness before and after model loading can be observed."""

    capabilities = EngineCapabilities(
        name="gated",
        mode="lockstep",
        input_sample_rate=24000,
        output_sample_rate=24000,
        chunk_period_ms=80,
        max_sessions=1,
        supports_barge_in=False,
    )

    def __init__(self, fail: bool = False) -> None:
        self.gate = asyncio.Event()
        self.fail = fail
        self._ready = False
        self.stopped = False

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("weights missing at /secret/path")
        self._ready = True

    async def open_session(self, session_id, options):  # pragma: no cover - not used here
        raise NotImplementedError

    async def stop(self) -> None:
        self.stopped = True

    def model_ids(self) -> list[str]:
        return ["gated-model"]

    def turn_engines(self) -> TurnEngines:
        return TurnEngines()

    def sleep_stages(self) -> Sequence[SleepStage]:
        return ()


async def test_health_is_503_until_engine_ready_then_200(config):
    engine = GatedStartEngine()
    async with serve_app(build_app(config, engine=engine)) as base, aiohttp.ClientSession() as http:
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 503
            assert (await resp.json())["status"] == "starting"
        engine.gate.set()
        for _ in range(100):
            async with http.get(f"{base}/health") as resp:
                if resp.status == 200:
                    assert await resp.json() == {"status": "ok"}
                    break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("/health never became 200")
    assert engine.stopped


class GatedRouteEngine:
    """Test double: an engine a route owns (as the image, video and Kyutai streaming routes do),
    loading until the test opens the gate."""

    def __init__(self, fail: bool = False) -> None:
        self.gate = asyncio.Event()
        self.fail = fail
        self.ready = False
        self.failure: str | None = None

    async def start(self) -> None:
        await self.gate.wait()
        if self.fail:
            self.failure = "weights missing at /secret/path"
        else:
            self.ready = True

    async def stop(self) -> None:
        pass


async def _health(http: aiohttp.ClientSession, base: str) -> tuple[int, dict]:
    async with http.get(f"{base}/health") as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("fail", [False, True])
async def test_health_waits_for_the_routes_own_engines_and_names_them(config, fail):
    """A server whose image route has an engine is not "ok" while that engine loads (requests to
    it would answer 503), and is "failed" if it never serves; the body says which engine."""
    session_engine = GatedStartEngine()
    session_engine.gate.set()
    app = build_app(config, engine=session_engine)
    image = GatedRouteEngine(fail=fail)
    run_with_app(app, image, "image")
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        try:
            for _ in range(100):
                if session_engine.ready:
                    break
                await asyncio.sleep(0.01)
            assert await _health(http, base) == (503, {"status": "starting", "route_engines": {"image": "loading"}})
        finally:
            image.gate.set()  # else the app's cleanup waits for its start forever
        for _ in range(100):
            status, body = await _health(http, base)
            if body["status"] != "starting":
                break
            await asyncio.sleep(0.01)
    if fail:
        assert status == 503 and body["code"] == "engine_failed" and body["route_engines"] == {"image": "failed"}
        assert "secret" not in str(body)
    else:
        assert (status, body) == (200, {"status": "ok", "route_engines": {"image": "ready"}})


async def test_failed_engine_start_keeps_health_503_and_its_exception_in_the_log(config, caplog):
    engine = GatedStartEngine(fail=True)
    engine.gate.set()
    async with serve_app(build_app(config, engine=engine)) as base, aiohttp.ClientSession() as http:
        for _ in range(100):
            async with http.get(f"{base}/health") as resp:
                body = await resp.json()
            if body["status"] == "failed":
                break
            await asyncio.sleep(0.01)
        assert resp.status == 503
    assert body["code"] == "engine_failed"
    assert "secret" not in str(body) and "RuntimeError" not in str(body)  # internals stay off the wire
    assert any("/secret/path" in (record.exc_text or "") for record in caplog.records)


async def test_models_list_has_openai_shape(config):
    async with serve_app(build_app(config, engine=GatedStartEngine())) as base, aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/models") as resp:
            body = await resp.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["gated-model"]
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in body["data"])


async def test_metrics_is_prometheus_text(config):
    app = build_app(config, engine=GatedStartEngine())
    from prometheus_client import Counter

    from rtserve.web.context import CTX

    Counter("rtserve_probe_total", "probe", registry=app[CTX].registry).inc(3)
    async with serve_app(app) as base, aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as resp:
        text = await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain")
    assert "rtserve_probe_total 3.0" in text


async def test_unknown_route_gets_openai_error_body(config):
    async with serve_app(build_app(config, engine=GatedStartEngine())) as base, aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/nothing") as resp:
            assert resp.status == 404
            body = await resp.json()
    assert body["error"]["code"] == "not_found"
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_api_key_required_on_routes_but_not_on_health(config):
    config.api_key = "sekrit"
    async with serve_app(build_app(config, engine=GatedStartEngine())) as base, aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/models") as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "invalid_api_key"
        async with http.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
        async with http.get(f"{base}/v1/models", headers={"Authorization": "Bearer sekrit"}) as resp:
            assert resp.status == 200
        async with http.get(f"{base}/v1/models", headers={"Authorization": "Api-Key sekrit"}) as resp:
            assert resp.status == 200  # openpi-client's form
        async with http.get(f"{base}/v1/models?api_key=sekrit") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/health") as resp:
            assert resp.status in (200, 503)


async def test_websocket_without_key_is_closed_4001(config):
    config.api_key = "sekrit"
    async with serve_app(build_app(config, engine=GatedStartEngine())) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(f"{base}/v1/models") as ws:
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 4001


async def test_metrics_show_the_processs_full_garbage_collections(config):
    """A collection holds the GIL for every thread of the process: /metrics counts them and how long they took."""
    app = build_app(config, engine=GatedStartEngine())
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        gc.collect()
        async with http.get(f"{base}/metrics") as resp:
            text = await resp.text()
    full = [line for line in text.splitlines() if line.startswith('rtserve_gc_pause_seconds_count{generation="2"}')]
    assert full and float(full[0].split()[-1]) >= 1


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/models?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a URL over 8 KB
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 9000 + b"\r\n\r\n",  # a header line
    ],
)
async def test_a_request_head_over_the_line_limit_is_400_and_one_info_line(config, caplog, head):
    """aiohttp refuses it; the log says so at INFO, once, without a traceback (issue 30)."""
    caplog.set_level("DEBUG", logger="aiohttp")
    async with serve_app(build_app(config, engine=GatedStartEngine())) as base:
        host, port = base.removeprefix("http://").split(":")
        for _ in range(3):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(head)
            status_line = await asyncio.wait_for(reader.readline(), 10)
            writer.close()
            assert status_line.split()[1] == b"400"
    served = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [r.levelname for r in served] == ["INFO"] * 3
    assert all(r.exc_info is None and "malformed request refused with 400" in r.getMessage() for r in served)
