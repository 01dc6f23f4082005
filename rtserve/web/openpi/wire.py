"""The openpi wire format: MessagePack with numpy arrays as marker maps.

Output uses the ``openpi-client`` markers, which its ``msgpack_numpy.unpackb`` decodes:

* ndarray: ``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": [...]}``
* numpy scalar: ``{b"__npgeneric__": True, b"data": item, b"dtype": dtype.str}``

Input accepts those plus the legacy vLLM-Omni markers (the msgpack-numpy layout):
``{nd: true, type: dtype.str, kind: dtype.kind, shape: [...], data: raw bytes}`` and
``{nd: false, type, kind, data}`` for scalars (``kind`` may also be empty, as the
original msgpack-numpy writes it). Marker keys may be ``str`` or ``bytes``.

Object, structured (void) and complex dtypes are refused both ways; a malformed marker
(unknown dtype, byte count not matching the shape) is a ``OpenPIFrameError`` whose message is
safe to show the client. Arrays decode zero-copy and read-only, as openpi's do. Maps and
arrays nested deeper than ``MAX_NESTING`` are refused too: MessagePack allows 1024 levels, and
an observation that deep failed later, when the engine link pickled it (Python's recursion
limit), closing the socket with 1011 instead of answering.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from rtserve.errors import INVALID_PAYLOAD, RtserveError

_REFUSED_KINDS = frozenset("VOc")  # structured/void, object, complex
_MAX_NDIM = 32
MAX_NESTING = 32  # levels of maps and arrays in one frame; an observation needs a handful


class OpenPIFrameError(RtserveError, ValueError):
    """A frame that is not a valid openpi message; ``str()`` is client-safe."""

    code = INVALID_PAYLOAD


def _field(marker: dict[Any, Any], name: str) -> Any:
    if name in marker:
        return marker[name]
    if name.encode() in marker:
        return marker[name.encode()]
    raise OpenPIFrameError(f"numpy marker lacks '{name}'")


def _has(marker: dict[Any, Any], name: str) -> bool:
    return name in marker or name.encode() in marker


def _dtype(value: Any) -> np.dtype[Any]:
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    if not isinstance(text, str):
        raise OpenPIFrameError("numpy marker dtype must be a string")
    try:
        dtype = np.dtype(text)
    except Exception:  # noqa: BLE001 - numpy raises TypeError, ValueError or SyntaxError for junk strings
        raise OpenPIFrameError(f"unknown numpy dtype {text[:64]!r}") from None
    if dtype.kind in _REFUSED_KINDS:
        raise OpenPIFrameError(
            f"numpy dtype {dtype} is not supported (object, structured and complex arrays are refused)"
        )
    return dtype


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or len(value) > _MAX_NDIM:
        raise OpenPIFrameError("numpy marker shape must be a list of at most 32 sizes")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise OpenPIFrameError("numpy marker shape must hold non-negative integers")
    return tuple(value)


def _array(data: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> npt.NDArray[Any]:
    if not isinstance(data, bytes):
        raise OpenPIFrameError("numpy marker data must be binary")
    if dtype.itemsize == 0 or math.prod(shape) * dtype.itemsize != len(data):
        raise OpenPIFrameError(
            f"numpy array data has {len(data)} bytes, shape {list(shape)} of {dtype} needs "
            f"{math.prod(shape) * dtype.itemsize}"
        )
    return np.ndarray(shape, dtype=dtype, buffer=data)


def _scalar(data: Any, dtype: np.dtype[Any]) -> np.generic:
    # Out of range is refused, not wrapped: numpy 1.x wraps integers (with a DeprecationWarning)
    # and turns finite floats into inf (with a RuntimeWarning).
    if dtype.kind in "iu" and isinstance(data, int) and not np.iinfo(dtype).min <= data <= np.iinfo(dtype).max:
        raise _does_not_fit(dtype)
    try:
        with np.errstate(over="raise"):
            scalar: np.generic = dtype.type(data)
    except (TypeError, ValueError, OverflowError, FloatingPointError):
        raise _does_not_fit(dtype) from None
    return scalar


def _does_not_fit(dtype: np.dtype[Any]) -> OpenPIFrameError:
    return OpenPIFrameError(f"numpy scalar value does not fit {dtype}")


def _legacy_scalar(data: Any, dtype: np.dtype[Any]) -> np.generic:
    # msgpack-numpy ships scalars as their raw bytes.
    return _array(data, dtype, (1,))[0] if isinstance(data, bytes) else _scalar(data, dtype)


def _decode_marker(obj: dict[Any, Any]) -> Any:
    if _has(obj, "__ndarray__"):
        return _array(_field(obj, "data"), _dtype(_field(obj, "dtype")), _shape(_field(obj, "shape")))
    if _has(obj, "__npgeneric__"):
        return _scalar(_field(obj, "data"), _dtype(_field(obj, "dtype")))
    if _has(obj, "nd") and _has(obj, "type") and _has(obj, "kind") and _has(obj, "data"):
        dtype = _dtype(_field(obj, "type"))
        kind = _field(obj, "kind")
        kind = kind.decode(errors="replace") if isinstance(kind, bytes) else kind
        if kind not in ("", dtype.kind):
            raise OpenPIFrameError(f"numpy marker kind {kind!r} does not match dtype {dtype}")
        if _field(obj, "nd"):
            return _array(_field(obj, "data"), dtype, _shape(_field(obj, "shape")))
        return _legacy_scalar(_field(obj, "data"), dtype)
    return obj


def unpack_message(frame: bytes) -> dict[str, Any]:
    """One client frame -> a dict with string keys, numpy markers decoded."""
    try:
        message = msgpack.unpackb(frame, object_hook=_decode_marker, raw=False)
    except OpenPIFrameError:
        raise
    except Exception:  # noqa: BLE001 - msgpack's own errors: truncated data, bad map keys, depth, ...
        raise OpenPIFrameError("frame is not valid MessagePack") from None
    if not isinstance(message, dict):
        raise OpenPIFrameError(f"a request must be a map, got {type(message).__name__}")
    if _nested_deeper_than(message, MAX_NESTING):
        raise OpenPIFrameError(f"maps and arrays are nested deeper than {MAX_NESTING} levels")
    if not all(isinstance(key, str) for key in message):
        raise OpenPIFrameError("request keys must be strings")
    return message


def _nested_deeper_than(message: dict[str, Any], limit: int) -> bool:
    """Whether maps and arrays (decoded arrays are leaves) nest deeper than ``limit``, the
    message itself level 1; walked without recursion."""
    pending: list[tuple[dict[Any, Any] | list[Any], int]] = [(message, 1)]
    while pending:
        node, level = pending.pop()
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                if level == limit:
                    return True
                pending.append((child, level + 1))
    return False


def _encode_numpy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in _REFUSED_KINDS:
        raise TypeError(f"cannot send numpy dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__}")


def pack_message(obj: Any) -> bytes:
    """Encode a server message; ``TypeError`` for values the wire cannot carry."""
    frame: bytes = msgpack.packb(obj, default=_encode_numpy, use_bin_type=True)
    return frame
