"""The robot policy's failures, each an ``EngineError`` with a stable code from the catalogue.

The openpi route renders them (``web/error_mapping.openpi_error_frame``); a policy that
cannot be loaded is logged and the route answers "Robot policy not available".
"""

from __future__ import annotations

from rtserve.engines.errors import EngineError
from rtserve.errors import (
    INFERENCE_ERROR,
    INVALID_OBSERVATION,
    MODEL_LOAD_FAILED,
    POLICY_OVERLOADED,
    POLICY_UNAVAILABLE,
)


class PolicyLoadError(EngineError):
    """The configured policy cannot be loaded; the message names ``robot.policy``."""

    code = MODEL_LOAD_FAILED


class InvalidObservation(EngineError):
    """A request's observation does not match the policy's spec; the message names the key."""

    code = INVALID_OBSERVATION


class PolicyOverloaded(EngineError):
    """The batcher's queue is full (``robot.max_pending_requests``)."""

    code = POLICY_OVERLOADED


class PolicyInferenceError(EngineError):
    """The policy raised or returned something unusable; details stay in the server log."""

    code = INFERENCE_ERROR


class PolicyStopped(EngineError):
    """The batcher is stopping; no more requests are served."""

    code = POLICY_UNAVAILABLE
