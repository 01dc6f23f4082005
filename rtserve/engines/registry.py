"""Every engine the app runs is built here: the session engine by name, the optional text
engine, the robot policy. Factories are imported lazily so an engine's heavy dependencies
(torch, model wheels) load only when that engine is selected."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, RobotConfig, ServerConfig
from rtserve.engines.protocols import HostedSessionEngine

if TYPE_CHECKING:
    from rtserve.engines.cascade.llm_stage import LlmStage
    from rtserve.engines.policy.batcher import PolicyBatcher
    from rtserve.engines.vllm_engine import VllmTextEngine

# name -> "module:factory"; factory(config, registry) -> HostedSessionEngine
ENGINES: dict[str, str] = {
    "loopback": "rtserve.engines.reference:create_loopback_engine",
    "tone": "rtserve.engines.reference:create_tone_engine",
    "tiny": "rtserve.engines.tiny_torch:create_engine",
    "cascade": "rtserve.engines.cascade:create_engine",
    "moshi": "rtserve.engines.moshi.engine:create_engine",
}


def create_engine(name: str, config: ServerConfig, registry: CollectorRegistry) -> HostedSessionEngine:
    try:
        target = ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES)) or "none"
        raise ConfigError(f"invalid config field 'engine': unknown engine {name!r} (known: {known})") from None
    module_name, factory_name = target.split(":")
    factory: Callable[[ServerConfig, CollectorRegistry], HostedSessionEngine] = getattr(
        importlib.import_module(module_name), factory_name
    )
    return factory(config, registry)


def create_text_engine(config: ServerConfig, registry: CollectorRegistry) -> VllmTextEngine | LlmStage | None:
    """The separate text engine behind chat (``http.text_engine``); None = the session engine's own LLM.
    ``embedded``: the cascade's LLM stage alone (``cascade.llm_runtime``, ``models.llm``), so a
    server whose session engine has no LLM (``--engine loopback``) serves one: an LLM server that
    another rtserve's voice agent reaches as its vLLM (docs/serving.md#tokenize)."""
    if config.http.text_engine == "session":
        return None
    if config.http.text_engine == "vllm":
        from rtserve.engines.vllm_engine import VllmTextEngine

        return VllmTextEngine(config.http.vllm)  # ConfigError here without the server's url or model
    if config.engine == "cascade":
        raise ConfigError(
            "invalid config field 'http.text_engine': 'embedded' loads the cascade's LLM, which the cascade "
            "engine serves chat with already ('session')"
        )
    if config.cascade.llm_engine != "embedded":
        raise ConfigError(
            "invalid config field 'http.text_engine': 'embedded' loads cascade.llm_runtime's model, but "
            "cascade.llm_engine is 'vllm'"
        )
    from rtserve.engines.cascade.llm_runtime import create_llm
    from rtserve.engines.cascade.llm_stage import LlmStage
    from rtserve.engines.cascade.metrics import CascadeMetrics

    llm = create_llm(config, CascadeMetrics(registry))
    assert isinstance(llm, LlmStage)  # cascade.llm_engine is 'embedded'
    return llm


def load_policy_batcher(config: RobotConfig, registry: CollectorRegistry) -> PolicyBatcher:
    """The robot policy behind its batcher, not started yet. Blocking: loading may read weights."""
    from rtserve.engines.policy.batcher import PolicyBatcher
    from rtserve.engines.policy.loading import load_policy

    return PolicyBatcher(
        load_policy(config),
        max_batch=config.max_batch,
        batch_window_s=config.batch_window_ms / 1000.0,
        max_pending=config.max_pending_requests,
        registry=registry,
    )
