"""Every error and limit of the openpi route over a raw WebSocket, and that a bad client
never disturbs another one."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy

from rtserve.engines.policy.demo import JOINT_POSITION, PROMPT, DemoDroidPolicy, example_observation
from rtserve.engines.values import PolicyRequest
from rtserve.web.openpi.wire import MAX_NESTING
from tests.web.openpi_support import EXPLODING, SECRET, openpi_server

INVALID = "Invalid request payload"


GATE = threading.Event()
ENTERED = threading.Event()


class GatedPolicy(DemoDroidPolicy):
    """The demo policy, holding every call until ``GATE`` opens (to fill the queue)."""

    def infer(self, batch):
        ENTERED.set()
        GATE.wait(10)
        return super().infer(batch)


def gated_policy() -> GatedPolicy:
    return GatedPolicy()


async def _connect(http: aiohttp.ClientSession, url: str) -> tuple[aiohttp.ClientWebSocketResponse, dict]:
    ws = await http.ws_connect(url, max_msg_size=0)
    handshake = await ws.receive_bytes(timeout=30)
    return ws, msgpack_numpy.unpackb(handshake)


async def _ask(ws: aiohttp.ClientWebSocketResponse, frame: bytes | dict[str, Any]) -> dict:
    await ws.send_bytes(frame if isinstance(frame, bytes) else msgpack_numpy.packb(frame))
    return msgpack_numpy.unpackb(await ws.receive_bytes(timeout=30))


async def _refused(ws: aiohttp.ClientWebSocketResponse, frame: bytes | dict[str, Any]) -> dict:
    """Send ``frame``; the answer must be an error as a TEXT frame (openpi-client raises on
    those), a JSON object."""
    await ws.send_bytes(frame if isinstance(frame, bytes) else msgpack_numpy.packb(frame))
    return json.loads(await ws.receive_str(timeout=30))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _ndarray_marker(dtype: str, data: bytes, shape: list[int]) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def _nested(levels: int) -> list:
    """Arrays inside arrays, ``levels`` deep."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _observation_with(key: str, marker: dict | list) -> bytes:
    obs = {k: v for k, v in example_observation(0).items() if k != key}
    packed = msgpack.unpackb(msgpack_numpy.packb(obs), raw=False)  # markers as plain maps
    packed[key] = marker
    return msgpack.packb(packed)


@pytest.mark.parametrize(
    ("frame", "detail"),
    [
        (b"\x93\x01", "not valid MessagePack"),
        (msgpack.packb(["not", "a", "map"]), "must be a map"),
        (_observation_with(JOINT_POSITION, _ndarray_marker("|O", b"\0" * 56, [7])), "object, structured and complex"),
        (_observation_with(JOINT_POSITION, _ndarray_marker("<c8", b"\0" * 56, [7])), "object, structured and complex"),
        (_observation_with(JOINT_POSITION, _ndarray_marker("|V8", b"\0" * 56, [7])), "object, structured and complex"),
        (msgpack.packb({"endpoint": "teleport"}), "unknown endpoint 'teleport'"),
        (msgpack.packb({"session_id": ["x"]}), "session_id must be a string"),
        (msgpack.packb({"endpoint": ["infer"]}), "endpoint must be a string"),
        (msgpack_numpy.packb({"endpoint": np.zeros(3)}), "endpoint must be a string"),
        (msgpack.packb({"endpoint": {"a": 1}}), "endpoint must be a string"),
        (msgpack_numpy.packb({**example_observation(0), "seed": "abc"}), "seed must be an integer"),
        (msgpack_numpy.packb({**example_observation(0), "seed": 2**64 - 1 + 0.5}), "seed must be an integer"),
        (msgpack_numpy.packb({**example_observation(0), "seed": -1}), "seed must be an integer"),
        (_observation_with("extra", _nested(MAX_NESTING)), "nested deeper than"),  # the link could not pickle it
        (_observation_with("extra", _nested(1000)), "nested deeper than"),
    ],
)
async def test_bad_frames_get_invalid_payload_and_the_connection_stays_usable(config, http, frame, detail):
    async with openpi_server(config) as (_, url):
        ws, _ = await _connect(http, url)
        error = await _refused(ws, frame)
        assert error["type"] == "error" and error["message"] == INVALID and error["code"] == "invalid_payload"
        assert detail in error["detail"]
        assert (await _ask(ws, example_observation(0)))["actions"].shape == (10, 8)


async def test_text_frames_are_not_observations(config, http):
    async with openpi_server(config) as (_, url):
        ws, _ = await _connect(http, url)
        await ws.send_str('{"endpoint": "infer", "prompt": "hi"}')
        error = json.loads(await ws.receive_str(timeout=30))
        assert error["message"] == INVALID and "text frames are not observations" in error["detail"]


async def test_legacy_vllm_markers_work_end_to_end(config, http):
    obs = example_observation(3)
    legacy = {
        key: {
            "nd": True,
            "type": value.dtype.str,
            "kind": value.dtype.kind,
            "shape": list(value.shape),
            "data": value.tobytes(),
        }
        if isinstance(value, np.ndarray)
        else value
        for key, value in obs.items()
    }
    async with openpi_server(config) as (_, url):
        ws, _ = await _connect(http, url)
        via_legacy = await _ask(ws, msgpack.packb({**legacy, "session_id": "legacy"}))
        via_openpi = await _ask(ws, {**obs, "session_id": "openpi"})
    np.testing.assert_array_equal(via_legacy["actions"], via_openpi["actions"])


async def test_missing_and_misshaped_keys_are_named(config, http):
    async with openpi_server(config) as (_, url):
        ws, _ = await _connect(http, url)
        obs = example_observation(0)
        del obs[JOINT_POSITION]
        error = await _refused(ws, obs)
        assert error == {
            "type": "error",
            "code": "invalid_observation",
            "message": f"missing observation key '{JOINT_POSITION}'",
        }
        error = await _refused(ws, {**example_observation(0), JOINT_POSITION: np.zeros(3)})
        assert error["message"] == f"observation key '{JOINT_POSITION}' must have shape [7], got [3]"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
async def test_non_finite_observation_is_invalid_observation_without_an_error_log(config, http, caplog, bad):
    joints = np.zeros(7)
    joints[3] = bad
    async with openpi_server(config) as (_, url):
        ws, _ = await _connect(http, url)
        error = await _refused(ws, {**example_observation(0), JOINT_POSITION: joints})
        assert error["code"] == "invalid_observation" and JOINT_POSITION in error["message"]
        assert (await _ask(ws, example_observation(0)))["actions"].shape == (10, 8)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_reset_endpoint_makes_the_next_infer_start_fresh(config, http):
    obs = example_observation(4)
    async with openpi_server(config) as (_, url):
        ws, _ = await _connect(http, url)
        first = (await _ask(ws, obs))["actions"]
        second = (await _ask(ws, obs))["actions"]
        assert await _ask(ws, {"endpoint": "reset"}) == {"status": "reset successful"}
        after_reset = (await _ask(ws, obs))["actions"]
    assert not np.allclose(first, second)
    np.testing.assert_array_equal(after_reset, first)


async def test_two_robots_with_the_same_session_id_do_not_share_state(config, http):
    obs = example_observation(5)
    async with openpi_server(config) as (_, url):
        robot_a, _ = await _connect(http, url)
        robot_b, _ = await _connect(http, url)
        a1 = (await _ask(robot_a, {**obs, "session_id": "default"}))["actions"]
        await _ask(robot_a, {**obs, "session_id": "default"})
        b1 = (await _ask(robot_b, {**obs, "session_id": "default"}))["actions"]
    np.testing.assert_array_equal(b1, a1)


async def test_policy_failure_is_a_generic_error_closes_1011_and_spares_the_batch_mate(config, http):
    async with openpi_server(config, policy=EXPLODING, batch_window_ms=60_000, max_batch=2) as (_, url):
        bad, _ = await _connect(http, url)
        good, _ = await _connect(http, url)
        explode = {**example_observation(0), PROMPT: "explode now"}
        error, ok = await asyncio.gather(_refused(bad, explode), _ask(good, example_observation(1)))
        assert error == {"type": "error", "message": "Internal inference error", "code": "inference_error"}
        assert SECRET not in json.dumps(error)
        alone = DemoDroidPolicy().infer([PolicyRequest("ref", example_observation(1), reset=True)])
        np.testing.assert_array_equal(ok["actions"], alone[0]["actions"])
        # As upstream's server: the failed robot's connection ends with 1011; the other goes on.
        closing = await bad.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert bad.close_code == aiohttp.WSCloseCode.INTERNAL_ERROR
        assert (await _ask(good, example_observation(2)))["actions"].shape == (10, 8)


async def test_oversized_message_closes_only_that_connection(config, http):
    async with openpi_server(config, max_message_bytes=64 * 1024) as (_, url):
        small = {"observation/joint_position": np.zeros(7)}
        other, _ = await _connect(http, url)
        big, _ = await _connect(http, url)
        await big.send_bytes(msgpack_numpy.packb({**small, "blob": np.zeros(128 * 1024, np.uint8)}))
        closing = await big.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert big.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        # 64 KiB is too small for DROID images: the other robot gets a typed error, not a close.
        error = await _refused(other, small)
        assert error["code"] == "invalid_observation"


async def test_idle_connection_is_closed(config, http):
    async with openpi_server(config, idle_timeout_s=0.3) as (_, url):
        ws, _ = await _connect(http, url)
        closing = await ws.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == aiohttp.WSCloseCode.OK


async def _infer_count(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith('rtserve_robot_requests_total{endpoint="infer"}'):
                return float(line.split()[-1])
    return 0.0


async def test_full_queue_answers_overloaded(config, http):
    GATE.clear()
    ENTERED.clear()
    policy = f"{__name__}:gated_policy"
    try:
        async with openpi_server(config, policy=policy, max_batch=1, max_pending_requests=1, batch_window_ms=0) as (
            base,
            url,
        ):
            robots = [(await _connect(http, url))[0] for _ in range(3)]
            running = asyncio.ensure_future(_ask(robots[0], example_observation(0)))
            assert await asyncio.to_thread(ENTERED.wait, 30)  # the engine thread holds request 1
            queued = asyncio.ensure_future(_ask(robots[1], example_observation(1)))
            for _ in range(300):  # until request 2 sits in the (one-slot) queue
                if await _infer_count(http, base) == 2:
                    break
                await asyncio.sleep(0.01)
            error = await _refused(robots[2], example_observation(2))
            assert error["code"] == "overloaded" and "queue is full" in error["message"]
            GATE.set()
            assert (await running)["actions"].shape == (10, 8)
            assert (await queued)["actions"].shape == (10, 8)
    finally:
        GATE.set()


@pytest.mark.parametrize("policy", ["none", "no_such_module_for_rtserve:factory"])
async def test_unavailable_policy_says_so_and_closes(config, http, policy):
    async with openpi_server(config, policy=policy) as (_, url):
        ws = await http.ws_connect(url, max_msg_size=0)
        error = msgpack_numpy.unpackb(await ws.receive_bytes(timeout=30))
        assert error == {"type": "error", "message": "Robot policy not available", "code": "unsupported"}
        closing = await ws.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
