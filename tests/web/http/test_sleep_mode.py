"""``POST /v1/omni/sleep`` / ``/v1/omni/wakeup`` (docs/serving.md#sleep-mode) over a real socket.

The engine double's stages hold a 64 MiB weight array each: release drops it, restore
allocates it again, so the freed/restored bytes the routes report are the process's real
resident memory moving. The embedded cascade's own numbers are in ``test_sleep_mode_cascade``.
"""

from __future__ import annotations

import gc
import json

import aiohttp
import numpy as np
import pytest
import websockets

from rtserve.engines.errors import EngineError
from tests.web.http_support import TurnEnginesSessionDouble, serve_doubles

MIB = 1 << 20


class WeightStage:
    """A stage whose 'weights' are 64 MiB of touched memory."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.releases = 0
        self.restores = 0
        self.fail_restore = False
        self.busy = False  # speech in flight outlasts the drain bound: release refuses
        self._weights: np.ndarray | None = np.ones(64 * MIB // 8)

    @property
    def asleep(self) -> bool:
        return self._weights is None

    async def release(self) -> None:
        if self.busy:
            raise EngineError("speech in flight", code="stage_busy")
        self.releases += 1
        self._weights = None

    async def restore(self) -> None:
        if self.fail_restore:
            raise RuntimeError("weights unreadable")
        self.restores += 1
        self._weights = np.ones(64 * MIB // 8)


class SleepyEngine(TurnEnginesSessionDouble):
    def __init__(self) -> None:
        super().__init__()
        self.stages = (WeightStage("asr"), WeightStage("tts"))

    def sleep_stages(self) -> tuple[WeightStage, ...]:
        return self.stages


async def post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict]:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json()


@pytest.fixture
def sleepy_config(config):
    config.enable_sleep_mode = True
    return config


async def wake(http: aiohttp.ClientSession, base: str, stage_ids: list[int]) -> tuple[int, dict]:
    """Wake ``stage_ids``, garbage collected first: the server measures what a wake restored as the
    process's resident memory before and after, and earlier tests' garbage freed during the wake
    (the server runs in this process) would be counted against it."""
    gc.collect()
    return await post(http, f"{base}/v1/omni/wakeup", {"stage_ids": stage_ids})


async def test_sleep_frees_memory_refuses_work_and_wake_restores_it(sleepy_config):
    engine = SleepyEngine()
    async with serve_doubles(sleepy_config, engine) as (base, _), aiohttp.ClientSession() as http:
        status, body = await post(http, f"{base}/v1/omni/sleep", {"stage_ids": [0, 1], "level": 1})
        assert status == 200 and body["status"] == "SUCCESS"
        assert body["stage_ids"] == [0, 1] and body["sleeping_stages"] == [0, 1]
        assert [a["stage"] for a in body["acks"]] == ["asr", "tts"]
        assert all(a["status"] == "SUCCESS" and a["freed_bytes"] > 48 * MIB for a in body["acks"])
        assert body["freed_bytes"] == sum(a["freed_bytes"] for a in body["acks"])

        # Asleep: work is refused at once with a typed error, never left hanging.
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 503 and (await resp.json())["error"]["code"] == "engine_sleeping"
        async with http.post(
            f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        ) as resp:
            assert resp.status == 503 and (await resp.json())["error"]["code"] == "engine_sleeping"
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(base.replace("http://", "ws://") + "/v1/audio/speech/stream")
        assert refused.value.response.status_code == 503

        status, body = await wake(http, base, [1])
        assert status == 200 and body["stage_ids"] == [1] and body["sleeping_stages"] == [0]
        assert body["acks"][0]["restored_bytes"] > 48 * MIB
        status, body = await post(http, f"{base}/v1/omni/wakeup", {})  # every stage: only 0 still sleeps
        assert status == 200 and body["stage_ids"] == [0] and body["sleeping_stages"] == []
        status, body = await post(http, f"{base}/v1/omni/wakeup", {"stage_ids": [0]})  # idempotent
        assert status == 200 and body["acks"] == [] and body["restored_bytes"] == 0
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 200 and await resp.read()
    assert [(s.releases, s.restores) for s in engine.stages] == [(1, 1), (1, 1)]


async def test_wake_after_level_2_reloads_the_stage_and_speech_is_served_again(sleepy_config):
    """Issue 30: a level-2 TTS sleep used to leave speech 503 until a restart."""
    engine = SleepyEngine()
    async with serve_doubles(sleepy_config, engine) as (base, _), aiohttp.ClientSession() as http:
        status, body = await post(http, f"{base}/v1/omni/sleep", {"stage_ids": [1], "level": 2})
        assert status == 200 and body["status"] == "SUCCESS" and body["acks"][0]["level"] == 2
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 503
        status, body = await wake(http, base, [1])
        assert status == 200 and body["stage_ids"] == [1] and body["sleeping_stages"] == []
        assert body["acks"][0]["restored_bytes"] > 48 * MIB
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 200 and await resp.read()
    assert (engine.stages[1].releases, engine.stages[1].restores) == (1, 1)


async def test_health_says_sleeping_with_the_stage_ids_and_stays_200(sleepy_config):
    engine = SleepyEngine()
    async with serve_doubles(sleepy_config, engine) as (base, _), aiohttp.ClientSession() as http:
        await post(http, f"{base}/v1/omni/sleep", {"level": 1})
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 200 and await resp.json() == {"status": "sleeping", "sleeping_stages": [0, 1]}
        await post(http, f"{base}/v1/omni/wakeup", {"stage_ids": [0]})
        async with http.get(f"{base}/health") as resp:
            assert await resp.json() == {"status": "sleeping", "sleeping_stages": [1]}
        await post(http, f"{base}/v1/omni/wakeup", {})
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"


async def test_a_stage_still_busy_refuses_the_sleep_with_409_and_stays_awake(sleepy_config):
    engine = SleepyEngine()
    engine.stages[1].busy = True
    async with serve_doubles(sleepy_config, engine) as (base, _), aiohttp.ClientSession() as http:
        status, body = await post(http, f"{base}/v1/omni/sleep", {"stage_ids": [1]})
        assert status == 409 and body["error"]["code"] == "stage_busy"
        async with http.get(f"{base}/health") as resp:
            assert (await resp.json())["status"] == "ok"  # the sleeping set did not change
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 200 and await resp.read()


async def test_a_failed_wake_keeps_the_stage_asleep(sleepy_config):
    engine = SleepyEngine()
    async with serve_doubles(sleepy_config, engine) as (base, _), aiohttp.ClientSession() as http:
        await post(http, f"{base}/v1/omni/sleep", {"stage_ids": [0]})
        engine.stages[0].fail_restore = True
        status, body = await post(http, f"{base}/v1/omni/wakeup", {"stage_ids": [0]})
        assert status == 500 and "weights unreadable" not in json.dumps(body)  # no internals on the wire
        engine.stages[0].fail_restore = False
        status, body = await post(http, f"{base}/v1/omni/wakeup", {"stage_ids": [0]})
        assert status == 200 and body["stage_ids"] == [0]


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("sleep", "{not json", None),
        ("sleep", "[0]", None),
        ("sleep", {"stage_ids": [0], "level": 3}, "level"),
        ("sleep", {"stage_ids": [0], "level": "1"}, "level"),
        ("sleep", {"stage_ids": [0], "level": True}, "level"),  # JSON true is not level 1
        ("sleep", {"stage_ids": [0], "level": 1.0}, "level"),
        ("sleep", {"stage_ids": [0], "level": 0}, "level"),
        ("sleep", {"stage_ids": "0"}, "stage_ids"),
        ("sleep", {"stage_ids": []}, "stage_ids"),
        ("sleep", {"stage_ids": [0.5]}, "stage_ids[0]"),
        ("sleep", {"stage_ids": [7]}, "stage_ids"),
        ("sleep", {"stage_ids": [-1]}, "stage_ids"),
        ("sleep", {"stage_id": [0]}, "stage_id"),
        ("wakeup", "{not json", None),
        ("wakeup", {"stage_ids": [0], "level": 1}, "level"),
        ("wakeup", {"stage_ids": None, "tags": ["weights"]}, "tags"),
        ("wakeup", {"stage_ids": ["0"]}, "stage_ids[0]"),
        ("wakeup", {"stage_ids": [9]}, "stage_ids"),
    ],
)
async def test_invalid_sleep_and_wakeup_requests_are_400_and_change_nothing(sleepy_config, route, body, param):
    engine = SleepyEngine()
    async with serve_doubles(sleepy_config, engine) as (base, _), aiohttp.ClientSession() as http:
        status, answer = await post(http, f"{base}/v1/omni/{route}", body)
        assert status == 400
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param
        if param == "level":
            assert answer["error"]["code"] == "invalid_value"
    assert all(s.releases == s.restores == 0 for s in engine.stages)


async def test_without_the_flag_the_routes_say_how_to_enable_them(config):
    async with serve_doubles(config, SleepyEngine()) as (base, _), aiohttp.ClientSession() as http:
        status, body = await post(http, f"{base}/v1/omni/sleep", {"stage_ids": [0], "level": 1})
    assert status == 404 and body["error"]["code"] == "sleep_mode_disabled"
    assert "--enable-sleep-mode" in body["error"]["message"]


async def test_an_engine_without_stages_refuses_naming_wake_up(sleepy_config):
    class Sleepless(TurnEnginesSessionDouble):
        def sleep_stages(self) -> tuple[()]:
            return ()

    async with serve_doubles(sleepy_config, Sleepless()) as (base, _), aiohttp.ClientSession() as http:
        status, body = await post(http, f"{base}/v1/omni/wakeup", {"stage_ids": [0]})
    assert status == 400 and body["error"]["code"] == "sleep_unsupported" and "wake_up" in body["error"]["message"]


def test_the_cli_flag_enables_sleep_mode():
    from rtserve.cli import _parser
    from rtserve.config import load_config

    args = _parser().parse_args(["serve", "--enable-sleep-mode"])
    assert load_config(overrides={"enable_sleep_mode": args.enable_sleep_mode}, environ={}).enable_sleep_mode
    assert not load_config(
        overrides={"enable_sleep_mode": _parser().parse_args(["serve"]).enable_sleep_mode}, environ={}
    ).enable_sleep_mode
