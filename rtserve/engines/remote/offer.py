"""What an engine process offers its workers, sent on connect and whenever it changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rtserve.engines.protocols import EngineCapabilities


@dataclass(frozen=True)
class TurnEngineInfo:
    """The attributes front-ends read off a turn engine without calling it."""

    model_name: str
    sample_rate: int = 0
    voices: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineOffer:
    capabilities: EngineCapabilities
    model_ids: tuple[str, ...]
    ready: bool
    failure: str | None = None  # why the engine could not start: /health says it
    asr: TurnEngineInfo | None = None
    llm: TurnEngineInfo | None = None
    tts: TurnEngineInfo | None = None
    policy_config: dict[str, Any] | None = None  # the openpi handshake dict, when a policy is served
