"""Engine names -> factories, imported lazily so an engine's heavy dependencies
(torch, model wheels) load only when that engine is selected."""

from __future__ import annotations

import importlib

from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.protocols import SessionEngine

# name -> "module:factory"; factory(config, registry) -> SessionEngine
ENGINES: dict[str, str] = {
    "loopback": "rtserve.engines.reference:create_loopback_engine",
    "tone": "rtserve.engines.reference:create_tone_engine",
    "tiny": "rtserve.engines.tiny_torch:create_engine",
    "cascade": "rtserve.engines.cascade:create_engine",
    "moshi": "rtserve.engines.moshi.engine:create_engine",
}


def create_engine(name: str, config: ServerConfig, registry: CollectorRegistry) -> SessionEngine:
    try:
        target = ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES)) or "none"
        raise ConfigError(f"invalid config field 'engine': unknown engine {name!r} (known: {known})") from None
    module_name, factory_name = target.split(":")
    factory = getattr(importlib.import_module(module_name), factory_name)
    return factory(config, registry)
