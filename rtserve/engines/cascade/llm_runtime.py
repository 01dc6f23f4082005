"""The cascade LLM stage for ``config.cascade.llm_engine`` / ``llm_runtime`` (the one place a runtime is
chosen): a vLLM server, or the embedded model on CTranslate2 or transformers (round-robin, continuously
batched, or a vision-language model)."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from rtserve.config import ServerConfig
from rtserve.engines.cascade.cores import stage_lanes
from rtserve.engines.cascade.first_audio import FirstAudioWork, StepAside
from rtserve.engines.cascade.llm import SmolLlm
from rtserve.engines.cascade.llm_batched import BatchedLlm
from rtserve.engines.cascade.llm_ct2 import Ct2Llm
from rtserve.engines.cascade.llm_stage import LlmStage, SamplingLimits
from rtserve.engines.cascade.llm_vision import VisionLlm
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_llm
from rtserve.engines.vllm_engine import VllmTextEngine


class _StageOptions(TypedDict):
    """``LlmStage``'s keyword arguments, the same for every embedded runtime."""

    cache_dir: Path
    cpu_threads: int
    max_active: int
    max_waiting: int
    context_tokens: int
    metrics: CascadeMetrics
    sampling: SamplingLimits


def create_llm(
    config: ServerConfig, metrics: CascadeMetrics, first_audio: FirstAudioWork | None = None
) -> LlmStage | VllmTextEngine:
    """``first_audio``: the engine's turns' first-audio work, which the CTranslate2 runtime's later
    decoding steps aside for (``first_audio``). ``models.llm`` is resolved (a bad path fails here,
    naming the key) only for the embedded runtimes: a vLLM server needs no local model."""
    if config.cascade.llm_engine == "vllm":
        return VllmTextEngine(config.http.vllm)
    paths, limits = config.models, config.cascade
    location = resolve_llm(paths)
    lanes = stage_lanes(limits)
    common = _StageOptions(
        cache_dir=Path(paths.cache_dir).expanduser(),
        cpu_threads=paths.cpu_threads,
        max_active=lanes.llm_max_active,
        max_waiting=limits.llm_max_waiting,
        context_tokens=limits.llm_context_tokens,
        metrics=metrics,
        sampling=SamplingLimits(limits.llm_max_temperature, limits.llm_max_top_p, limits.llm_top_k),
    )
    if limits.llm_runtime == "transformers":
        return SmolLlm(location, **common)
    if limits.llm_runtime == "transformers_batched":
        return BatchedLlm(
            location,
            device=limits.llm_device,
            dtype=limits.llm_dtype,
            kv_tokens=limits.llm_kv_tokens,
            cuda_graphs=limits.llm_cuda_graphs,
            **common,
        )
    if limits.llm_runtime == "transformers_vision":
        return VisionLlm(location, **common)
    return Ct2Llm(
        location,
        compute_type=limits.llm_compute_type,
        threads=limits.llm_threads,
        cached_openings=limits.llm_cached_openings,
        gather_s=limits.llm_gather_ms / 1000,
        lanes=lanes.llm,
        step_aside=None
        if first_audio is None or not limits.llm_step_aside_ms
        else StepAside(first_audio, limits.llm_first_piece_tokens, limits.llm_step_aside_ms / 1000),
        **common,
    )
