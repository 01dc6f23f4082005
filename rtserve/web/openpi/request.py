"""The control fields of an openpi request, checked and taken out of the observation.

``endpoint`` (``"infer"`` when omitted, or ``"reset"``), ``session_id`` (a string or an
integer; omitted keeps the connection's current session) and ``seed`` (an integer in
[0, 2**64), passed to the policy) travel in the same map as the observation; whatever
else the map holds is the observation. A field of the wrong type is a ``OpenPIFrameError``, never
an exception further in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rtserve.web.openpi.wire import OpenPIFrameError

MAX_SESSION_ID_CHARS = 256
_ENDPOINTS = ("infer", "reset")
_SEED_LIMIT = 2**64  # what numpy's generators accept, and msgpack's largest integer


@dataclass(frozen=True)
class OpenPIRequest:
    endpoint: Literal["infer", "reset"]
    observation: dict[str, Any]
    session_id: str | None  # None keeps the connection's current session
    seed: int | None


def _endpoint(value: Any) -> Literal["infer", "reset"]:
    if not isinstance(value, str):
        raise OpenPIFrameError("endpoint must be a string: 'infer' or 'reset'")
    if value == "reset":
        return "reset"
    if value == "infer":
        return "infer"
    raise OpenPIFrameError(f"unknown endpoint {value[:64]!r} (use 'infer' or 'reset')")


def _session_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | int) or isinstance(value, bool) or len(str(value)) > MAX_SESSION_ID_CHARS:
        raise OpenPIFrameError(f"session_id must be a string of at most {MAX_SESSION_ID_CHARS} characters")
    return str(value)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    # openpi-client's packer sends a numpy integer as a scalar marker, decoded to np.integer.
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or not 0 <= int(value) < _SEED_LIMIT:
        raise OpenPIFrameError("seed must be an integer from 0 to 2**64 - 1")
    return int(value)


def parse_request(message: dict[str, Any]) -> OpenPIRequest:
    """Split a decoded frame into its control fields and the observation (``message`` is consumed)."""
    endpoint = _endpoint(message.pop("endpoint", "infer"))
    session_id = _session_id(message.pop("session_id", None))
    seed = _seed(message.pop("seed", None))
    return OpenPIRequest(endpoint, message, session_id, seed)
