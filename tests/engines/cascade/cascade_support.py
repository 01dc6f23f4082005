"""Helpers of the cascade model tests (imported by name: the tests folders are not packages)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.llm_ct2 import Ct2Llm

QUESTION = "What is the capital of France?"
MAX_SESSIONS = 3


@dataclass(frozen=True)
class Loaded:
    engine: CascadeEngine
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@dataclass(frozen=True)
class Float32Ct2:
    llm: Ct2Llm
    registry: CollectorRegistry


async def speak_16k(engine: CascadeEngine, text: str) -> np.ndarray:
    """``text`` spoken by the engine's own TTS, at the engine's 16 kHz input rate."""
    chunks = [chunk async for chunk in engine.tts.synthesize(text)]
    return resample(np.concatenate(chunks), engine.tts.sample_rate, engine.capabilities.input_sample_rate)


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:\"'").lower() for w in text.split()} - {""}
