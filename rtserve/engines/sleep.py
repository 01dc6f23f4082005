"""Sleep mode: unload an engine's models on request and load them again (docs/serving.md#sleep-mode).

The engine's ``sleep_stages()`` are numbered from 0 in its pipeline order (the cascade:
VAD, ASR, LLM, TTS). ``sleep(stage_ids, level)`` releases each stage and reports the
resident memory it gave back; ``wake_up(stage_ids)`` restores the sleeping ones among them
and reports what they took again. As in vLLM-Omni:

* level 1 keeps what is needed to come back and level 2 discards the weights; rtserve's stages
  always load their weights from disk, so both drop them from memory and a wake after either
  reloads them (vLLM-Omni refuses a wake after level 2; here nothing is lost that disk lacks);
* a stage lets the work it already accepted finish before it unloads (the cascade's TTS: the
  speech in flight, bounded by ``cascade.sleep_drain_timeout_s``, else ``stage_busy``) and
  refuses new work meanwhile;
* the sleeping set changes only on success: a refused or failed wake leaves it as it was;
* a wake of stages that are awake is a no-op with no acks (idempotent);
* while any stage sleeps the engine refuses new work with ``engine_sleeping``.

Memory is the process's resident set size (RSS) measured after a garbage collection and
``malloc_trim`` (glibc keeps freed heap otherwise), so the numbers are what the operating
system got back. Calls are serialized: one sleep or wake at a time.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Sequence
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import SleepStage
from rtserve.errors import INVALID_VALUE, SLEEP_UNSUPPORTED

log = logging.getLogger(__name__)

LEVELS = (1, 2)
SUCCESS = "SUCCESS"
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name)


_LIBC = _libc()


def resident_bytes() -> int:
    """This process's RSS after returning freed memory to the OS (blocking: run off the loop)."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE


class SleepUnsupported(EngineError):
    code = SLEEP_UNSUPPORTED


class SleepController:
    def __init__(self, engine_name: str, stages: Sequence[SleepStage]) -> None:
        self._engine_name = engine_name
        self._stages = tuple(stages)
        self._levels: dict[int, int] = {}  # sleeping stage id -> the level it was put to sleep at
        self._lock = asyncio.Lock()

    @property
    def sleeping(self) -> tuple[int, ...]:
        return tuple(sorted(self._levels))

    def stages(self) -> list[dict[str, Any]]:
        return [
            {"stage_id": i, "stage": s.stage, "sleeping": i in self._levels, "level": self._levels.get(i)}
            for i, s in enumerate(self._stages)
        ]

    def _ids(self, stage_ids: Sequence[int] | None, verb: str) -> list[int]:
        if not self._stages:
            raise SleepUnsupported(f"the engine {self._engine_name!r} does not support sleep or wake_up")
        if stage_ids is None:
            return list(range(len(self._stages)))
        unknown = [i for i in stage_ids if not 0 <= i < len(self._stages)]
        if unknown:
            raise EngineError(
                f"cannot {verb} unknown stage_ids {unknown}: this engine has stages "
                f"0-{len(self._stages) - 1} ({', '.join(s.stage for s in self._stages)})",
                code=INVALID_VALUE,
                param="stage_ids",
            )
        return sorted(set(stage_ids))

    async def sleep(self, stage_ids: Sequence[int] | None, level: int) -> list[dict[str, Any]]:
        if level not in LEVELS:
            raise EngineError(f"level must be 1 or 2, got {level}", code=INVALID_VALUE, param="level")
        async with self._lock:
            acks = []
            for i in self._ids(stage_ids, "sleep"):
                stage = self._stages[i]
                freed = 0
                if i not in self._levels:
                    before = await asyncio.to_thread(resident_bytes)
                    self._levels[i] = level  # refuse new work from here on
                    try:
                        await stage.release()
                    except BaseException:
                        del self._levels[i]  # refused or failed: the stage is still awake
                        raise
                    freed = max(0, before - await asyncio.to_thread(resident_bytes))
                self._levels[i] = max(level, self._levels[i])
                log.info("stage %d (%s) asleep at level %d; %d bytes freed", i, stage.stage, level, freed)
                acks.append(
                    {
                        "stage_id": i,
                        "stage": stage.stage,
                        "status": SUCCESS,
                        "level": self._levels[i],
                        "freed_bytes": freed,
                    }
                )
            return acks

    async def wake_up(self, stage_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        async with self._lock:
            asleep = [i for i in self._ids(stage_ids, "wake_up") if i in self._levels]
            acks = []
            for i in asleep:
                stage = self._stages[i]
                before = await asyncio.to_thread(resident_bytes)
                await stage.restore()  # raises: the stage stays in the sleeping set
                del self._levels[i]
                restored = max(0, await asyncio.to_thread(resident_bytes) - before)
                log.info("stage %d (%s) awake; %d bytes restored", i, stage.stage, restored)
                acks.append({"stage_id": i, "stage": stage.stage, "status": SUCCESS, "restored_bytes": restored})
            return acks
