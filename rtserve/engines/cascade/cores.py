"""How many lanes each CPU stage of the cascade gets on this host (docs/engines.md#cascade-cores).

A lane is one thread that runs one model call at a time (``worker.ModelWorker`` for VAD, ASR
and TTS, a decode thread with its own batch for the CTranslate2 LLM); lanes of one stage share
the one loaded model. Unset config values (``cascade.vad_lanes``, ``asr_lanes``, ``tts_lanes``,
``llm_lanes``, ``llm_max_active``) are sized here from the cores this process may run on,
so a session's turn finds a free lane while another session's reply is still being spoken.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rtserve.config import CascadeLimits

# The LLM decodes for the whole reply (seconds), ASR and TTS run ~0.1 s calls: the LLM gets
# a lane per two cores (one intra-op thread each, ``cascade.llm_threads``), ASR and TTS one
# per four cores (``models.cpu_threads`` each). Two LLM lanes at least: on two cores two
# batches of four decode ~1.5x faster than one of eight. Two ASR lanes at least: turns that
# end together have their pause transcripts decoded side by side, so each turn's end is
# decided sooner (2 cores, 4 and 8 simultaneous turns: first audio p50 0.85-0.95x of one lane,
# benchmarks/notes/voice_agent_quality.md).
_CORES_PER_LLM_LANE = 2
_CORES_PER_ASR_LANE = 4
_CORES_PER_TTS_LANE = 4
# Silero scores every session's audio all the time (~0.1-0.2 ms per 32 ms window): one thread
# holds ~100-200 sessions, so hundreds of sessions need several.
_CORES_PER_VAD_LANE = 4
_MIN_LLM_LANES = 2
_MIN_ASR_LANES = 2
_LLM_REQUESTS_PER_LANE = 4


def host_cores() -> int:
    """The cores this process may run on (its affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class StageLanes:
    asr: int
    tts: int
    llm: int
    vad: int
    llm_max_active: int  # requests decoded at once, shared among the LLM lanes


def stage_lanes(limits: CascadeLimits, cores: int | None = None) -> StageLanes:
    """The configured lanes, or those sized from ``cores`` (default: this host's) where unset."""
    cores = host_cores() if cores is None else cores
    llm = limits.llm_lanes or max(_MIN_LLM_LANES, cores // _CORES_PER_LLM_LANE)
    return StageLanes(
        asr=limits.asr_lanes or max(_MIN_ASR_LANES, cores // _CORES_PER_ASR_LANE),
        tts=limits.tts_lanes or max(1, cores // _CORES_PER_TTS_LANE),
        llm=llm,
        llm_max_active=limits.llm_max_active or llm * _LLM_REQUESTS_PER_LANE,
        vad=limits.vad_lanes or max(1, cores // _CORES_PER_VAD_LANE),
    )
