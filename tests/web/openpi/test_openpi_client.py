"""Interop: the real ``openpi-client`` WebsocketClientPolicy against the running server."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import numpy as np
import pytest
import websockets
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from rtserve.engines.policy.demo import JOINT_POSITION, PROMPT, DemoDroidPolicy, example_observation
from rtserve.engines.values import PolicyRequest
from tests.web.openpi_support import EXPLODING, SECRET, host_port, openpi_server

ROBOTS = 6


def _reference_actions(seed: int) -> np.ndarray:
    """What the demo policy computes for this observation as a session's first step, alone."""
    return DemoDroidPolicy().infer([PolicyRequest("ref", example_observation(seed), reset=True)])[0]["actions"]


async def test_handshake_infer_and_timing(config):
    async with openpi_server(config) as (_, url):

        def drive() -> tuple[dict, dict]:
            client = WebsocketClientPolicy(host=url)
            return client.get_server_metadata(), client.infer(example_observation(1))

        metadata, response = await asyncio.to_thread(drive)
    assert metadata == DemoDroidPolicy().server_config()
    assert response["actions"].shape == (10, 8) and response["actions"].dtype == np.float32
    np.testing.assert_array_equal(response["actions"], _reference_actions(1))
    assert set(response["server_timing"]) >= {"infer_ms", "queue_ms", "batch_size"}
    assert response["server_timing"]["batch_size"] == 1
    assert response["policy_timing"]["infer_ms"] > 0


async def test_first_infer_and_changed_session_id_start_fresh(config):
    async with openpi_server(config) as (_, url):

        def drive() -> list[np.ndarray]:
            client = WebsocketClientPolicy(host=url)
            obs = example_observation(2)
            steps = [client.infer({**obs, "session_id": "episode-1"}) for _ in range(2)]
            steps.append(client.infer({**obs, "session_id": "episode-2"}))
            steps.append(client.infer(obs))  # omitted session_id keeps the current session
            return [s["actions"] for s in steps]

        first, second, new_session, continued = await asyncio.to_thread(drive)
    np.testing.assert_array_equal(first, _reference_actions(2))
    assert not np.allclose(second, first), "the second step of a session carries its memory"
    np.testing.assert_array_equal(new_session, first)
    np.testing.assert_array_equal(continued, second)


async def _concurrent_robots(config, **robot) -> list[dict]:
    """ROBOTS openpi clients connect, then all infer at once; returns their responses."""
    async with openpi_server(config, **robot) as (_, url):
        clients = await asyncio.gather(*(asyncio.to_thread(WebsocketClientPolicy, host=url) for _ in range(ROBOTS)))
        barrier = threading.Barrier(ROBOTS)

        def infer(index: int) -> dict:
            barrier.wait(10)
            return clients[index].infer(example_observation(index))

        return await asyncio.gather(*(asyncio.to_thread(infer, i) for i in range(ROBOTS)))


async def test_concurrent_robots_share_one_batch_without_changing_results(config):
    # A window far longer than the test: the batch closes because every robot is waiting.
    responses = await _concurrent_robots(config, batch_window_ms=60_000, max_batch=ROBOTS)
    assert [r["server_timing"]["batch_size"] for r in responses] == [ROBOTS] * ROBOTS
    for index, response in enumerate(responses):
        np.testing.assert_array_equal(response["actions"], _reference_actions(index))


async def test_batching_disabled_serves_one_by_one_with_identical_results(config):
    responses = await _concurrent_robots(config, batch_window_ms=60_000, max_batch=1)
    assert [r["server_timing"]["batch_size"] for r in responses] == [1] * ROBOTS
    for index, response in enumerate(responses):
        np.testing.assert_array_equal(response["actions"], _reference_actions(index))


async def test_healthz_and_metrics(config):
    async with openpi_server(config) as (base, url), aiohttp.ClientSession() as http:
        await asyncio.to_thread(lambda: WebsocketClientPolicy(host=url).infer(example_observation(0)))
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"{base}/metrics") as resp:
            text = await resp.text()
    assert 'rtserve_robot_requests_total{endpoint="infer"} 1.0' in text
    assert "rtserve_robot_batch_size_count 1.0" in text
    assert "rtserve_robot_inference_seconds_count 1.0" in text
    assert "rtserve_robot_request_seconds_count 1.0" in text


async def test_client_without_a_path_is_served_at_the_root(config):
    """``WebsocketClientPolicy(host, port)``, as openpi's README shows it (upstream serves at /)."""
    async with openpi_server(config) as (base, _), aiohttp.ClientSession() as http:

        def drive() -> tuple[dict, dict]:
            client = WebsocketClientPolicy(*host_port(base))
            return client.get_server_metadata(), client.infer(example_observation(1))

        metadata, response = await asyncio.to_thread(drive)
        async with http.get(f"{base}/") as resp:  # only WebSocket upgrades at / are the robot route
            assert resp.status == 200 and resp.content_type == "text/html"  # a plain GET: the browser page
    assert metadata == DemoDroidPolicy().server_config()
    np.testing.assert_array_equal(response["actions"], _reference_actions(1))


async def test_policy_failure_makes_infer_raise_and_closes_with_1011(config):
    async with openpi_server(config, policy=EXPLODING) as (base, _):

        def drive() -> tuple[RuntimeError, websockets.ConnectionClosedError]:
            client = WebsocketClientPolicy(*host_port(base))
            with pytest.raises(RuntimeError) as failed:
                client.infer({**example_observation(0), PROMPT: "explode now"})
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                client.infer(example_observation(0))
            return failed.value, closed.value

        failed, closed = await asyncio.to_thread(drive)
    assert "Internal inference error" in str(failed) and "inference_error" in str(failed)
    assert SECRET not in str(failed) and "Traceback" not in str(failed)
    assert closed.rcvd is not None and closed.rcvd.code == 1011


async def test_invalid_observation_makes_infer_raise_and_the_robot_can_go_on(config):
    async with openpi_server(config) as (_, url):

        def drive() -> tuple[RuntimeError, dict]:
            client = WebsocketClientPolicy(host=url)
            with pytest.raises(RuntimeError) as refused:
                client.infer({**example_observation(0), JOINT_POSITION: np.zeros(3)})
            return refused.value, client.infer(example_observation(0))

        refused, response = await asyncio.to_thread(drive)
    assert "invalid_observation" in str(refused) and JOINT_POSITION in str(refused)
    assert response["actions"].shape == (10, 8)


async def test_seed_reaches_the_policy(config):
    """Same seed, same actions; another seed or none, other actions (each a session's first step)."""
    obs = example_observation(6)
    async with openpi_server(config) as (_, url):

        def first_step(**extra: object) -> np.ndarray:
            return WebsocketClientPolicy(host=url).infer({**obs, **extra})["actions"]

        seeded, again, other, unseeded = await asyncio.gather(
            *(asyncio.to_thread(first_step, **extra) for extra in ({"seed": 7}, {"seed": 7}, {"seed": 8}, {}))
        )
    np.testing.assert_array_equal(seeded, again)
    assert not np.allclose(seeded, other)
    assert not np.allclose(seeded, unseeded)
    np.testing.assert_array_equal(unseeded, _reference_actions(6))


async def test_root_route_needs_the_api_key_like_the_full_path(config):
    config = config.model_copy(update={"api_key": "robot-key"})
    async with openpi_server(config) as (base, _):

        def drive() -> dict:
            with pytest.raises(websockets.ConnectionClosedError) as refused:
                WebsocketClientPolicy(*host_port(base))
            assert refused.value.rcvd is not None and refused.value.rcvd.code == 4001  # rtserve's "invalid api key"
            return WebsocketClientPolicy(*host_port(base), api_key="robot-key").infer(example_observation(0))

        response = await asyncio.to_thread(drive)
    assert response["actions"].shape == (10, 8)
