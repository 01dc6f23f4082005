"""Interop: the real ``openpi-client`` WebsocketClientPolicy against the running server."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from rtserve.engines.policy.demo import DemoDroidPolicy, example_observation
from rtserve.engines.protocols import PolicyRequest
from tests.web.openpi_support import openpi_server

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
