"""Per-event overhead of the session core: submit -> runner -> bounded buffer -> consumer.

For 1, 64 and 512 live sessions (each with its own consumer task reading wire text, as a
transport would), two paths are timed end to end on one event loop:

* ``command``: ``submit(Heartbeat)`` -> mailbox -> runner -> ``session.heartbeat_ack``
  rendered to compact JSON -> buffer -> sequenced, journaled delivery;
* ``audio``: an engine ``OutputAudio`` of one 80 ms frame (1920 samples at 24 kHz) ->
  pump -> mailbox -> runner (epoch fence) -> ``response.output_audio.delta`` (PCM16
  base64) + its transcript delta -> buffer -> delivery. Per event = per delivered event.

The engine is an in-file no-op ``EngineSession`` (it only forwards scripted output), so
the numbers are the session core's own cost. Each figure is the median of ``--repeats``
runs of ``--rounds`` rounds.

Usage: .venv/bin/python benchmarks/bench_sessions.py [--sessions 1,64,512] [--rounds 20] [--repeats 5]
Writes benchmarks/results/bench_sessions.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import numpy as np

from rtserve.config import SessionLimits
from rtserve.engines.events import EngineEvent, OutputAudio
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import EngineCapabilities, Pcm, ResponseRequest, SessionOptions
from rtserve.sessions import RealtimeProjection, SessionHandle, SessionManager
from rtserve.sessions import commands as cmd

RESULTS = Path(__file__).parent / "results" / "bench_sessions.json"
BATCH = 32  # events per session per round: well inside the 512-event buffer
FRAME = np.random.default_rng(0).uniform(-0.5, 0.5, 1920).astype(np.float32)
CAPABILITIES = EngineCapabilities(
    name="bench-null",
    mode="lockstep",
    input_sample_rate=24000,
    output_sample_rate=24000,
    chunk_period_ms=80,
    max_sessions=100_000,
    supports_barge_in=False,
)


class NullEngineSession:
    """Forwards whatever ``emit`` is given; does no work of its own."""

    capabilities = CAPABILITIES

    def __init__(self) -> None:
        self.epoch = 0
        self.queue: asyncio.Queue[EngineEvent | None] = asyncio.Queue()

    def push_audio(self, pcm: Pcm) -> None: ...

    async def commit_input(self) -> None: ...

    def clear_input(self) -> None: ...

    async def drain(self) -> None: ...

    def respond(self, request: ResponseRequest) -> None: ...

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def configure_turn_detection(self, settings: TurnDetection | None) -> None: ...

    async def events(self) -> AsyncGenerator[EngineEvent, None]:
        while (item := await self.queue.get()) is not None:
            yield item

    async def close(self) -> None:
        self.queue.put_nowait(None)


class NullEngine:
    capabilities = CAPABILITIES
    ready = True

    def __init__(self) -> None:
        self.sessions: dict[str, NullEngineSession] = {}

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def model_ids(self) -> list[str]:
        return [CAPABILITIES.name]

    async def open_session(self, session_id: str, options: SessionOptions) -> NullEngineSession:
        self.sessions[session_id] = NullEngineSession()
        return self.sessions[session_id]


async def consume(
    handle: SessionHandle, counts: list[int], index: int, wakeups: dict[int, asyncio.Event], target: list[int]
) -> None:
    attachment = handle.attachment
    assert attachment is not None  # open() attaches the first consumer
    async for delivery in attachment.deliveries():
        _ = delivery.text  # what a transport would send
        counts[index] += 1
        if counts[index] >= target[0]:
            waiter = wakeups.get(index)
            if waiter is not None:
                waiter.set()


async def run_once(sessions: int, path: str, rounds: int) -> float:
    """Microseconds per delivered event for one run."""
    engine = NullEngine()
    limits = SessionLimits(max_sessions=sessions, idle_ttl_s=None)
    manager = SessionManager(engine, limits)
    handles = [await manager.open(projection=RealtimeProjection("ga", duplex=True)) for _ in range(sessions)]
    counts = [0] * sessions
    target = [1]  # SessionCreated
    wakeups: dict[int, asyncio.Event] = {}
    readers = [asyncio.create_task(consume(h, counts, i, wakeups, target)) for i, h in enumerate(handles)]
    engine_sessions = [engine.sessions[h.session_id] for h in handles]

    async def wait_all() -> None:
        for i in range(sessions):
            if counts[i] < target[0]:
                wakeups[i] = asyncio.Event()
                await wakeups[i].wait()
                del wakeups[i]

    await wait_all()
    if path == "audio":  # open the eternal response outside the timed region
        for es in engine_sessions:
            es.queue.put_nowait(OutputAudio(FRAME, 0))
        target[0] += 5  # response created, item added, output item, content part, audio
        await wait_all()
    per_round = BATCH if path == "command" else 2 * BATCH
    start = time.perf_counter()
    for _ in range(rounds):
        target[0] += per_round
        for handle, es in zip(handles, engine_sessions):
            for _ in range(BATCH):
                if path == "command":
                    handle.submit(cmd.Heartbeat())
                else:
                    es.queue.put_nowait(OutputAudio(FRAME, 0, text="a"))
        await wait_all()
    elapsed = time.perf_counter() - start
    await manager.shutdown()
    await asyncio.gather(*readers)
    return elapsed * 1e6 / (sessions * rounds * per_round)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,64,512")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for sessions in [int(s) for s in args.sessions.split(",")]:
        for path in ("command", "audio"):
            runs = [await run_once(sessions, path, args.rounds) for _ in range(args.repeats)]
            median = statistics.median(runs)
            rows.append(
                {
                    "sessions": sessions,
                    "path": path,
                    "us_per_event_median": round(median, 2),
                    "us_per_event_min": round(min(runs), 2),
                    "events_per_s": round(1e6 / median),
                    "events_per_run": sessions * args.rounds * BATCH * (1 if path == "command" else 2),
                }
            )
    print(f"{'sessions':>8} {'path':>8} {'us/event (median)':>18} {'min':>8} {'events/s':>10}")
    for row in rows:
        print(
            f"{row['sessions']:>8} {row['path']:>8} {row['us_per_event_median']:>18.2f} "
            f"{row['us_per_event_min']:>8.2f} {row['events_per_s']:>10}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "bench_sessions",
                "rounds": args.rounds,
                "repeats": args.repeats,
                "batch": BATCH,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())
