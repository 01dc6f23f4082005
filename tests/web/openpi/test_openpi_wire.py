"""openpi MessagePack + numpy markers, checked against the real openpi-client codec."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from openpi_client import msgpack_numpy

from rtserve.web.openpi.wire import MAX_NESTING, OpenPIFrameError, pack_message, unpack_message

_DTYPES = ["uint8", "int8", "int16", "<i4", ">i4", "int64", "float16", "<f4", ">f8", "bool"]


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(_DTYPES).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_any_openpi_client_array_decodes_exactly(array):
    decoded = unpack_message(msgpack_numpy.packb({"x": array}))["x"]
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(_DTYPES).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_openpi_client_decodes_what_we_send(array):
    decoded = msgpack_numpy.unpackb(pack_message({"actions": array}))["actions"]
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def test_nested_values_scalars_and_plain_types_round_trip():
    message = {"a": {"b": [np.arange(3, dtype=np.int16), np.float32(1.5)]}, "s": "text", "n": 3, "f": None}
    decoded = unpack_message(msgpack_numpy.packb(message))
    np.testing.assert_array_equal(decoded["a"]["b"][0], [0, 1, 2])
    assert decoded["a"]["b"][1] == np.float32(1.5) and isinstance(decoded["a"]["b"][1], np.float32)
    assert decoded["s"] == "text" and decoded["n"] == 3 and decoded["f"] is None
    sent = msgpack_numpy.unpackb(pack_message({"v": np.int64(7), "arr": np.ones((2, 3))[:, ::2]}))
    assert sent["v"] == 7 and isinstance(sent["v"], np.int64)
    np.testing.assert_array_equal(sent["arr"], np.ones((2, 2)))  # non-contiguous views are sent correctly


def test_nesting_is_accepted_up_to_the_bound_and_refused_past_it():
    def message(levels: int) -> bytes:  # the message map is the first level
        value: list = []
        for _ in range(levels - 2):
            value = [value]
        return msgpack.packb({"state": value})

    assert unpack_message(message(MAX_NESTING))["state"]
    with pytest.raises(OpenPIFrameError, match=f"deeper than {MAX_NESTING} levels"):
        unpack_message(message(MAX_NESTING + 1))


@pytest.mark.parametrize("key_type", [str, bytes])
@pytest.mark.parametrize("kind", ["f", ""])
def test_legacy_vllm_markers_are_accepted_on_input(key_type, kind):
    def k(name: str):
        return key_type(name) if key_type is str else name.encode()

    array = np.arange(6, dtype="<f4").reshape(2, 3)
    marker = {k("nd"): True, k("type"): "<f4", k("kind"): kind, k("shape"): [2, 3], k("data"): array.tobytes()}
    scalar = {k("nd"): False, k("type"): "<f4", k("kind"): kind, k("data"): np.float32(2.5).tobytes()}
    decoded = unpack_message(msgpack.packb({"state": marker, "gain": scalar}))
    np.testing.assert_array_equal(decoded["state"], array)
    assert decoded["gain"] == np.float32(2.5)


def _marker(dtype: str, data: bytes, shape: list[int]) -> bytes:
    return msgpack.packb({"x": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


@pytest.mark.parametrize(
    ("frame", "detail"),
    [
        (_marker("|O", b"\0" * 8, [1]), "object, structured and complex arrays are refused"),
        (_marker("<c16", b"\0" * 16, [1]), "object, structured and complex arrays are refused"),
        (_marker("[('a', '<i4'), ('b', '<f4')]", b"\0" * 8, [1]), "unknown numpy dtype"),
        (_marker("V8", b"\0" * 8, [1]), "object, structured and complex arrays are refused"),
        (_marker("(2,)<i4", b"\0" * 8, [1]), "object, structured and complex arrays are refused"),
        (_marker("<f4", b"\0" * 7, [2]), "has 7 bytes"),
        (_marker("<f4", b"\0" * 8, [-2]), "non-negative integers"),
        (_marker("no-such-dtype", b"", [0]), "unknown numpy dtype"),
        (_marker("S0", b"", [3]), "needs"),
        (msgpack.packb({"x": {b"__ndarray__": True, b"dtype": "<f4"}}), "lacks 'data'"),
        (msgpack.packb({"x": {b"__npgeneric__": True, b"data": "text", b"dtype": "<f4"}}), "does not fit"),
        (msgpack.packb({"x": {b"__npgeneric__": True, b"data": 1e300, b"dtype": "<f4"}}), "does not fit"),
        (msgpack.packb({"x": {b"__npgeneric__": True, b"data": 1000, b"dtype": "<i1"}}), "does not fit"),
        (msgpack.packb({"x": {b"__npgeneric__": True, b"data": -1, b"dtype": "<u2"}}), "does not fit"),
        (
            msgpack.packb({"x": {"nd": True, "type": "<f4", "kind": "i", "shape": [1], "data": b"\0" * 4}}),
            "does not match dtype",
        ),
        (msgpack.packb([1, 2, 3]), "must be a map"),
        (msgpack.packb({1: 2}), "not valid MessagePack"),
        (msgpack.packb({b"bytes-key": 2}), "keys must be strings"),
        (b"\xc1\xff\x00garbage", "not valid MessagePack"),
        (msgpack.packb({"a": 1})[:-1], "not valid MessagePack"),
    ],
)
def test_malformed_frames_are_wire_errors(frame, detail):
    with pytest.raises(OpenPIFrameError) as info:
        unpack_message(frame)
    assert detail in str(info.value)


def test_complex_actions_cannot_be_sent():
    with pytest.raises(TypeError):
        pack_message({"actions": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError):
        pack_message({"actions": object()})
