"""The errors engines raise to their callers, each with a stable client-safe ``code``."""

from __future__ import annotations

from rtserve.errors import ENGINE_ERROR, RESOURCE_EXHAUSTED, RtserveError


class EngineError(RtserveError):
    """A failure an engine reports to its caller with a stable, client-safe ``code``."""

    code = ENGINE_ERROR


class CapacityExhausted(EngineError):
    """Every slot is taken; the caller refuses the session at once (never queues)."""

    code = RESOURCE_EXHAUSTED
