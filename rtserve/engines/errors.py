"""The errors engines raise to their callers, each with a stable client-safe ``code``."""

from __future__ import annotations

import sys

from rtserve.errors import ENGINE_ERROR, RESOURCE_EXHAUSTED, RtserveError


class EngineError(RtserveError):
    """A failure an engine reports to its caller with a stable, client-safe ``code``."""

    code = ENGINE_ERROR


class CapacityExhausted(EngineError):
    """Every slot is taken; the caller refuses the session at once (never queues)."""

    code = RESOURCE_EXHAUSTED


def build_failure(exc: Exception, sized_by: str) -> str:
    """What an engine whose start failed on something other than its settings or weights (out of
    GPU memory beside another process's models, a device fault) tells its clients and its log.
    ``sized_by``: the settings that size what it builds, named where the GPU had no room."""
    first_line = next(iter(str(exc).splitlines()), "")
    torch = sys.modules.get("torch")  # not imported here: without torch loaded, no torch error
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return f"out of GPU memory while building the engine, which {sized_by} size: {first_line}"
    return f"{type(exc).__name__}: {first_line}"
