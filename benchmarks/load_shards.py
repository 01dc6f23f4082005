"""Run a load benchmark's clients in several processes.

One asyncio process sending 256 paced streams reaches most of a core, and then its own timer
slip shows up as server latency. Each shard is a spawned process that runs its share of the
clients on its own event loop against the same absolute schedule (``time.monotonic``, which is
what asyncio's ``loop.time()`` reads, is one clock for every process on the host), measures its
own CPU over the steady window, and returns its client logs to the parent.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Log = TypeVar("Log")
Result = TypeVar("Result")


@dataclass
class ShardResult(Generic[Log]):
    logs: list[Log]  # in the order of the shard's client indices
    cpu_s: float  # the shard's own CPU time over the steady window


def split(clients: int, shards: int) -> list[range]:
    """Client indices per shard; interleaved so every shard has clients at every phase."""
    return [range(k, clients, shards) for k in range(min(shards, clients))]


def run_shard(clients: Callable[[], Coroutine[Any, Any, list[Log]]], window: tuple[float, float]) -> ShardResult[Log]:
    """Entry point inside a shard process: run the clients, timing this process's CPU over ``window``."""

    async def main() -> ShardResult[Log]:
        cpu: list[float] = []

        async def measure() -> None:
            for at in window:
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                cpu.append(time.process_time())

        meter = asyncio.create_task(measure())
        logs = await clients()
        await meter
        return ShardResult(logs, cpu[1] - cpu[0])

    return asyncio.run(main())


async def gather_shards(shard: Callable[..., ShardResult[Log]], jobs: list[tuple[Any, ...]]) -> list[ShardResult[Log]]:
    """Run ``shard(*job)`` for each job in its own spawned process (a fresh interpreter: no
    event loop or sockets inherited from the parent) and collect the results."""
    return await in_processes(shard, jobs, len(jobs))


async def in_processes(
    function: Callable[..., Result], jobs: list[tuple[Any, ...]], processes: int | None = None
) -> list[Result]:
    """``function(*job)`` for each job, in spawned processes (default: one per core), results in job order."""
    processes = processes or min(len(jobs), os.cpu_count() or 1)
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(await asyncio.gather(*(asyncio.wrap_future(pool.submit(function, *job)) for job in jobs)))


def merge_logs(results: list[ShardResult[Log]], ranges: list[range], clients: int) -> list[Log]:
    """Every client's log at its global index."""
    logs: list[Log | None] = [None] * clients
    for result, indices in zip(results, ranges):
        for index, log in zip(indices, result.logs):
            logs[index] = log
    return [log for log in logs if log is not None]
