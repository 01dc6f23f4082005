"""Typed failures of the cascade engine (stable ``code`` values, client-safe messages)."""

from __future__ import annotations

from rtserve.config import ConfigError
from rtserve.engines.errors import EngineError
from rtserve.errors import ENGINE_SLEEPING, MODEL_NOT_READY, MODEL_UNAVAILABLE


class ModelUnavailable(EngineError, ConfigError):
    """A configured model is missing or not a local model of the expected kind.

    Also a ``ConfigError``: found while building the app, ``rtserve serve`` exits with the
    one-line message naming the ``models.*`` key instead of a traceback."""

    code = MODEL_UNAVAILABLE


class ModelNotReady(EngineError):
    """A model was called before ``start()`` finished loading it."""

    code = MODEL_NOT_READY


class EngineSleeping(EngineError):
    """Sleep mode unloaded the model (``POST /v1/omni/sleep``); wake it to serve again."""

    code = ENGINE_SLEEPING

    def __init__(self) -> None:
        super().__init__("the engine is asleep (sleep mode); POST /v1/omni/wakeup to wake it")
