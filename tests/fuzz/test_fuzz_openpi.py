"""Fuzzing the openpi MessagePack parser through its real socket: random MessagePack, numpy
markers of every shape (wrong dtypes, sizes, shapes, both marker layouts), valid DROID
observations with one key replaced, random control fields, raw bytes and text frames. Each
frame gets actions, a reset answer, or a typed JSON error frame (never ``inference_error``:
input the policy cannot take must be refused before it); a robot connected before keeps
getting actions; the log stays clean; RSS stays bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets
from hypothesis import given
from hypothesis import strategies as st
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.sync.client import connect

from rtserve.app import build_app
from rtserve.engines.policy.demo import example_observation
from tests.fuzz.fuzz_support import FUZZ, WAIT_S, FuzzServer, check_close_code, check_error, fuzz_config, fuzz_server

pytestmark = pytest.mark.timeout(240)

ROUTE = "/v1/realtime/robot/openpi"
OBSERVATION = example_observation(0)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10) | st.binary(max_size=10), inner, max_size=4)
    ),
    max_leaves=8,
)
dtypes = (
    st.sampled_from(
        ["<f4", "<f8", "|u1", "<i8", "|b1", "<f2", ">f4", "|O", "|V8", "<c8", "S3", "<U2", "bogus", "", "<M8[s]"]
    )
    | values
)
ndarray_markers = st.one_of(
    st.fixed_dictionaries(
        {b"__ndarray__": st.just(True)},
        optional={
            b"data": st.binary(max_size=64) | values,
            b"dtype": dtypes,
            b"shape": st.lists(st.integers(-2, 2**40), max_size=5) | values,
        },
    ),
    st.fixed_dictionaries(
        {"nd": st.booleans()},
        optional={
            "type": dtypes,
            "kind": st.sampled_from(["f", "u", "", "O", "V"]) | values,
            "shape": st.lists(st.integers(-2, 2**40), max_size=5) | values,
            "data": st.binary(max_size=64) | values,
        },
    ),
    st.fixed_dictionaries({b"__npgeneric__": st.just(True)}, optional={b"data": values, b"dtype": dtypes}),
)


def _fill(dtype: str, value: str) -> float:
    """``value`` for a float array ("lowest": the dtype's most negative finite value), 1 otherwise."""
    if not dtype.startswith("float"):
        return 1
    return float(np.finfo(dtype).min) if value == "lowest" else float(value)


arrays = st.tuples(
    st.sampled_from(["float32", "float64", "uint8", "int64", "bool", "float16"]),
    st.lists(st.integers(0, 9), max_size=4),
    st.sampled_from(["0", "nan", "inf", "lowest", "3"]),
).map(lambda t: np.full(t[1], _fill(t[0], t[2]), dtype=t[0]))
fields = st.one_of(values, ndarray_markers, arrays)


def _replace(args: tuple[str, Any, dict[str, Any]]) -> dict[str, Any]:
    key, value, control = args
    return {**OBSERVATION, key: value, **control}


control = st.fixed_dictionaries(
    {},
    optional={
        "endpoint": st.sampled_from(["infer", "reset", "x"]) | values,
        "session_id": st.text(max_size=300) | values,
        "seed": st.integers(-5, 2**64 - 1) | values,
    },
)
observations = st.tuples(st.sampled_from(sorted(OBSERVATION)) | st.text(max_size=10), fields, control).map(_replace)
frames = st.one_of(
    observations.map(msgpack_numpy.packb),
    observations.map(msgpack_numpy.packb),
    st.dictionaries(st.text(max_size=10), fields, max_size=5).map(msgpack_numpy.packb),
    values.map(msgpack_numpy.packb),
    st.binary(max_size=200),
    st.text(max_size=50),
)


@dataclass
class ServedRobot:
    """The fuzzed server and the canary robot, connected before fuzzing."""

    server: FuzzServer
    robot: WebsocketClientPolicy


@pytest.fixture(scope="module")
def served() -> Iterator[ServedRobot]:
    async def make_app():
        return build_app(fuzz_config())

    with fuzz_server(make_app) as running:
        robot = WebsocketClientPolicy(running.ws_base + ROUTE)
        assert "actions" in robot.infer(example_observation(1))
        yield ServedRobot(running, robot)


@pytest.fixture(scope="module")
def server(served: ServedRobot) -> FuzzServer:
    return served.server


def exchange(server: FuzzServer, messages: list[bytes | str]) -> None:
    """Each frame gets one answer: actions (or a reset's status) or a typed text error."""
    with connect(server.ws_base + ROUTE, open_timeout=WAIT_S, close_timeout=WAIT_S, max_size=None) as ws:
        try:
            assert isinstance(ws.recv(timeout=WAIT_S), bytes)  # the server config
            for message in messages:
                ws.send(message)
                answer = ws.recv(timeout=WAIT_S)
                if isinstance(answer, str):
                    error = json.loads(answer)
                    check_error(error.get("code"), error.get("message"))
                    assert error["code"] != "inference_error", error
                else:
                    reply = msgpack.unpackb(answer)
                    assert "actions" in reply or reply.get("status") == "reset successful", reply
        except websockets.ConnectionClosed as closed:
            check_close_code(closed.rcvd.code if closed.rcvd else None)
    server.assert_clean_log()


@FUZZ
@given(st.lists(frames, min_size=1, max_size=5))
def test_frames_get_actions_or_typed_errors(server: FuzzServer, messages: list[bytes | str]) -> None:
    exchange(server, messages)


def test_zz_afterwards_the_robot_and_the_canary_work_the_log_is_clean(served: ServedRobot) -> None:
    assert "actions" in served.robot.infer(example_observation(2))
    served.server.assert_healthy_after_fuzzing()
