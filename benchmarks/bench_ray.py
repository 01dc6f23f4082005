"""What the Ray actor boundary adds per frame: the engine link over TCP to a Ray engine actor
versus over a Unix socket to a local engine process (``--workers`` layout), loopback engine.

The benchmark process is the front-end: it opens ``--sessions`` lockstep sessions through the
engine client (no WebSockets, no codecs: only the boundary is measured) and pushes one 80 ms
frame per session per period, sessions spread over the period like independent callers
(the link batches whatever arrived into one ``FRAMES_IN`` per tick). Every frame carries its sequence
number in its sample values; the loopback engine (delay 0) returns it at the next tick, so
each returned frame is matched to the push it echoes.

Reported per mode and N over the steady window (after ``--warmup`` s):

* latency: echo arrival minus push, p50/p99 (includes the wait for the engine's next tick,
  uniform over one 80 ms period, the same in both modes: compare the two rows);
* lost: frames pushed in the window that never came back;
* CPU per session-frame: the front-end process and the engine process (the actor's
  process for ``ray``), in microseconds.

``ray`` starts a local one-node Ray cluster (``ray.init()``) in this process and removes
its engine actor afterwards.

    .venv/bin/python benchmarks/bench_ray.py --sessions 64 256 --duration 20
    .venv/bin/python benchmarks/bench_ray.py --sessions 16 64 --duration 8

Writes benchmarks/results/bench_ray.json (``--json`` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig, load_config
from rtserve.engines.events import OutputAudio
from rtserve.engines.protocols import EngineSession
from rtserve.engines.remote.client import RemoteEngines
from rtserve.engines.remote.link import EngineLink
from rtserve.engines.values import SessionOptions
from rtserve.processes import engine_main

if TYPE_CHECKING:
    from rtserve.cluster.engines import ClusterEngines

RATE = 24_000
FRAME = 1920
PERIOD_S = FRAME / RATE
_SEQ_RING = 4000  # sequence numbers are carried modulo this (exact in float32 as k / 8192)
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    mode: str
    sessions: int
    frames: int
    lost: int
    p50_ms: float
    p99_ms: float
    front_end_us_per_frame: float
    engine_us_per_frame: float


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _config(sessions: int) -> ServerConfig:
    config = load_config(environ={})
    config.engine = "loopback"
    config.lockstep.batch_size = sessions
    config.reference.loopback_delay_frames = 0
    config.log_level = "warning"
    return config


class _Session:
    def __init__(self, session: EngineSession) -> None:
        self.session = session
        self.sent: dict[int, float] = {}
        self.latencies: list[float] = []
        self.measuring = False

    async def read(self) -> None:
        async for event in self.session.events():
            if isinstance(event, OutputAudio) and len(event.pcm):
                arrived = time.perf_counter()
                seq = round(float(event.pcm[-1]) * 8192) - 1
                pushed = self.sent.pop(seq, None)
                if pushed is not None and self.measuring:
                    self.latencies.append(arrived - pushed)


async def _drive(
    engines: RemoteEngines | ClusterEngines,
    mode: str,
    sessions: int,
    duration_s: float,
    warmup_s: float,
    engine_pid: int,
) -> Row:
    opened = [
        _Session(await engines.session_engine.open_session(f"bench-{i}", SessionOptions())) for i in range(sessions)
    ]
    readers = [asyncio.create_task(s.read()) for s in opened]
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + warmup_s + duration_s
    pushed = [0] * sessions

    async def pace(index: int) -> None:
        """One session's frames on an absolute schedule; sessions spread over the period, as
        independent callers are (so the wait for the engine's tick averages over phases)."""
        s, phase, seq = opened[index], index * PERIOD_S / sessions, 0
        while (now := loop.time()) < end:
            s.measuring = now >= start + warmup_s
            s.sent[seq % _SEQ_RING] = time.perf_counter()
            s.session.push_audio(np.full(FRAME, (seq % _SEQ_RING + 1) / 8192, np.float32))
            pushed[index] += s.measuring
            seq += 1
            await asyncio.sleep(max(0.0, start + phase + seq * PERIOD_S - loop.time()))

    pacers = [asyncio.create_task(pace(i)) for i in range(sessions)]
    await asyncio.sleep(warmup_s)
    cpu_front, cpu_engine = time.process_time(), _cpu_seconds(engine_pid)
    await asyncio.gather(*pacers)
    cpu_front, cpu_engine = time.process_time() - cpu_front, _cpu_seconds(engine_pid) - cpu_engine
    await asyncio.sleep(3 * PERIOD_S)  # the last echoes
    latencies = np.array([x for s in opened for x in s.latencies]) * 1000
    for s in opened:
        await s.session.close()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    frames = sum(pushed)
    return Row(
        mode,
        sessions,
        frames,
        max(0, frames - len(latencies)),
        float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
        cpu_front / max(1, frames) * 1e6,
        cpu_engine / max(1, frames) * 1e6,
    )


async def _unix(config: ServerConfig, sessions: int, duration_s: float, warmup_s: float) -> Row:
    """The ``--workers`` layout: an engine process serving the link on a Unix socket."""
    folder = tempfile.mkdtemp(prefix="rtserve-bench-")
    path = os.path.join(folder, "engine.sock")
    child = multiprocessing.get_context("spawn").Process(
        target=engine_main.run, args=(config.model_dump(mode="json"), path, os.getpid())
    )
    child.start()
    try:
        while not await asyncio.to_thread(os.path.exists, path):  # noqa: ASYNC110 - no event crosses the process boundary
            await asyncio.sleep(0.05)
        settings = config.engine_link
        link = EngineLink(
            lambda: asyncio.open_unix_connection(path),
            0,
            settings=settings,
        )
        link.start()
        await link.connected.wait()
        assert link.offer is not None
        engines = RemoteEngines(link, link.offer, max_queued_events=settings.max_queued_events)
        while not engines.ready:  # noqa: ASYNC110 - readiness is a property, not an event
            await asyncio.sleep(0.05)
        assert child.pid is not None  # started
        try:
            return await _drive(engines, "unix socket (engine process)", sessions, duration_s, warmup_s, child.pid)
        finally:
            await engines.stop()
    finally:
        child.terminate()
        child.join(10)
        shutil.rmtree(folder, ignore_errors=True)


async def _ray(config: ServerConfig, sessions: int, duration_s: float, warmup_s: float) -> Row:
    """An engine actor on a local Ray node, reached over TCP after the secret handshake."""
    import ray

    from rtserve.cluster.frontend import cluster_engines

    config.cluster = config.cluster.model_copy(
        update={
            "address": "local",
            "namespace": "rtserve-bench",
            "engine_prefix": f"bench-{sessions}",
            "engines": 1,
            "engine_num_cpus": 1,
            "secret": os.urandom(16).hex(),
            "engine_host": "127.0.0.1",
        }
    )
    engines = await cluster_engines(config, CollectorRegistry(), worker_index=0)
    actor = ray.get_actor(f"bench-{sessions}-0", namespace="rtserve-bench")
    try:
        while not engines.ready:  # noqa: ASYNC110 - readiness is a property, not an event
            await asyncio.sleep(0.05)
        pid = (await actor.placement.remote())["pid"]
        return await _drive(engines, "tcp + auth (Ray actor)", sessions, duration_s, warmup_s, pid)
    finally:
        await engines.stop()
        ray.kill(actor, no_restart=True)
        ray.util.remove_placement_group(ray.util.get_placement_group(f"bench-{sessions}-placement"))


async def _main(args: argparse.Namespace) -> list[Row]:
    rows = []
    for sessions in args.sessions:
        for mode in args.modes:
            run = _unix if mode == "unix" else _ray
            rows.append(await run(_config(sessions), sessions, args.duration, args.warmup))
            print(_format(rows[-1]), flush=True)
    return rows


def _format(row: Row) -> str:
    return (
        f"{row.mode:<30} {row.sessions:>5} {row.frames:>8} {row.lost:>6} {row.p50_ms:>8.1f} {row.p99_ms:>8.1f} "
        f"{row.front_end_us_per_frame:>12.1f} {row.engine_us_per_frame:>12.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--modes", nargs="+", choices=["unix", "ray"], default=["unix", "ray"])
    parser.add_argument("--duration", type=float, default=20.0, help="steady window, seconds")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--json", default=str(Path(__file__).parent / "results" / "bench_ray.json"), help="where the rows are written"
    )
    args = parser.parse_args()
    print(
        f"{'mode':<30} {'N':>5} {'frames':>8} {'lost':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'front us/fr':>12} {'engine us/fr':>12}"
    )
    try:
        rows = asyncio.run(_main(args))
    finally:
        if "ray" in args.modes:
            import ray

            ray.shutdown()
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "rows": [asdict(r) for r in rows]}, indent=2)
    )


if __name__ == "__main__":
    main()
