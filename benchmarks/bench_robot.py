"""Simulated robots against the real server's openpi route, batched vs unbatched.

For each server mode (batching on with ``--max-batch``/``--window-ms``, then off with
``max_batch=1``) this starts ``rtserve serve --engine loopback`` in its own process and,
for each robot count, runs that many robots for ``--duration`` seconds. A robot is a
closed control loop at ``--rate`` Hz (DROID: 15 Hz): it sends the DROID demo
observation, waits for the action chunk, then sleeps until its next tick (a late reply
makes it send at once). Robots start at random phases, like unsynchronised machines.

Reported per point: round-trip p50/p99 (client clock), the server's queue and policy
time, mean batch size per policy call (from /metrics), the largest batch, achieved
request rate and the share of steps whose reply came later than one control period.

    .venv/bin/python benchmarks/bench_robot.py                # 30 s per point (3 min)
    .venv/bin/python benchmarks/bench_robot.py --duration 5   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from openpi_client import msgpack_numpy
from server_process import ServerProcess  # benchmarks/ is on sys.path: scripts run from there

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first

from rtserve.engines.policy.demo import example_observation  # noqa: E402
from rtserve.web.openpi.routes import ROUTE  # noqa: E402

WARMUP_STEPS = 3  # per robot, excluded from the statistics


@dataclass
class RobotLog:
    rtt_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    policy_ms: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    late: int = 0
    errors: int = 0
    last_error: str | None = None


@dataclass
class Point:
    mode: str
    robots: int
    duration_s: float
    requests: int
    errors: int
    achieved_hz_per_robot: float
    rtt_p50_ms: float
    rtt_p99_ms: float
    queue_p50_ms: float
    policy_p50_ms: float
    batch_mean: float
    batch_max: int
    late_pct: float


async def _policy_loaded(http: aiohttp.ClientSession, base: str) -> bool:
    async with http.ws_connect(base.replace("http", "ws") + ROUTE) as ws:
        await ws.receive_bytes(timeout=30)  # the metadata handshake: the policy is loaded
        return True


async def _batch_counters(http: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    """(policy calls, observations served) so far, from the server's /metrics."""
    values = {"rtserve_robot_batch_size_count": 0.0, "rtserve_robot_batch_size_sum": 0.0}
    async with http.get(f"{base}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            name, _, value = line.partition(" ")
            if name in values:
                values[name] = float(value)
    return values["rtserve_robot_batch_size_count"], values["rtserve_robot_batch_size_sum"]


async def _robot(
    http: aiohttp.ClientSession, url: str, index: int, rate_hz: float, stop_at: float, phase_s: float, log: RobotLog
) -> None:
    frame = msgpack_numpy.packb({**example_observation(index), "session_id": f"robot-{index}"})
    period = 1.0 / rate_hz
    async with http.ws_connect(url, max_msg_size=0, compress=0) as ws:
        await ws.receive_bytes()  # handshake
        next_tick = time.perf_counter() + phase_s
        step = 0
        while True:
            await asyncio.sleep(max(0.0, next_tick - time.perf_counter()))
            if time.perf_counter() >= stop_at:
                return
            sent = time.perf_counter()
            await ws.send_bytes(frame)
            msg = await ws.receive()
            # Errors come as JSON text frames (openpi clients raise on those), actions as binary.
            reply = json.loads(msg.data) if msg.type is aiohttp.WSMsgType.TEXT else msgpack_numpy.unpackb(msg.data)
            rtt = time.perf_counter() - sent
            step += 1
            next_tick = max(next_tick + period, time.perf_counter())
            if step <= WARMUP_STEPS:
                continue
            if "actions" not in reply:
                log.errors += 1
                log.last_error = str(reply.get("message"))
                continue
            log.rtt_ms.append(rtt * 1000)
            log.queue_ms.append(reply["server_timing"]["queue_ms"])
            log.policy_ms.append(reply["policy_timing"]["infer_ms"])
            log.batch_sizes.append(int(reply["server_timing"]["batch_size"]))
            log.late += rtt > period


async def _run_point(
    http: aiohttp.ClientSession,
    server: ServerProcess,
    mode: str,
    robots: int,
    rate_hz: float,
    duration_s: float,
    rng: random.Random,
) -> Point:
    url = server.base.replace("http", "ws") + ROUTE
    logs = [RobotLog() for _ in range(robots)]
    calls_before, served_before = await _batch_counters(http, server.base)
    stop_at = time.perf_counter() + duration_s + WARMUP_STEPS / rate_hz
    await asyncio.gather(
        *(_robot(http, url, i, rate_hz, stop_at, rng.uniform(0, 1 / rate_hz), logs[i]) for i in range(robots))
    )
    calls_after, served_after = await _batch_counters(http, server.base)
    rtt = np.concatenate([log.rtt_ms for log in logs])
    requests = len(rtt)
    failures = {log.last_error for log in logs if log.last_error}
    if not requests:
        raise RuntimeError(f"no successful replies; server said: {failures}")
    return Point(
        mode=mode,
        robots=robots,
        duration_s=duration_s,
        requests=requests,
        errors=sum(log.errors for log in logs),
        achieved_hz_per_robot=requests / duration_s / robots,
        rtt_p50_ms=float(np.percentile(rtt, 50)),
        rtt_p99_ms=float(np.percentile(rtt, 99)),
        queue_p50_ms=float(np.median(np.concatenate([log.queue_ms for log in logs]))),
        policy_p50_ms=float(np.median(np.concatenate([log.policy_ms for log in logs]))),
        batch_mean=(served_after - served_before) / max(1.0, calls_after - calls_before),
        batch_max=int(max(max(log.batch_sizes) for log in logs)),
        late_pct=100.0 * sum(log.late for log in logs) / max(1, requests),
    )


def _print_table(points: list[Point], rate_hz: float) -> None:
    header = (
        f"{'mode':<10} {'robots':>6} {'req/s':>7} {'Hz/robot':>8} {'rtt p50':>8} {'rtt p99':>8} "
        f"{'queue p50':>9} {'policy p50':>10} {'batch mean':>10} {'batch max':>9} {'late %':>7}"
    )
    print(f"\nround trip in ms; late = reply after one {1000 / rate_hz:.1f} ms control period")
    print(header)
    print("-" * len(header))
    for p in points:
        print(
            f"{p.mode:<10} {p.robots:>6} {p.requests / p.duration_s:>7.1f} {p.achieved_hz_per_robot:>8.2f} "
            f"{p.rtt_p50_ms:>8.2f} {p.rtt_p99_ms:>8.2f} {p.queue_p50_ms:>9.2f} {p.policy_p50_ms:>10.2f} "
            f"{p.batch_mean:>10.2f} {p.batch_max:>9d} {p.late_pct:>7.2f}"
        )


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    threads = {"torch_threads": str(args.torch_threads)}
    modes = [
        ("batched", {"max_batch": str(args.max_batch), "batch_window_ms": str(args.window_ms), **threads}),
        ("unbatched", {"max_batch": "1", "batch_window_ms": "0", **threads}),
    ]
    rng = random.Random(args.seed)
    points: list[Point] = []
    async with aiohttp.ClientSession() as http:
        for mode, robot_env in modes:
            server = ServerProcess({f"RTSERVE_ROBOT__{k.upper()}": v for k, v in robot_env.items()}, name="bench_robot")
            try:
                policy_loaded = functools.partial(_policy_loaded, base=server.base)
                await server.wait_ready(http, timeout_s=120.0, probe=policy_loaded)
                for robots in args.robots:
                    point = await _run_point(http, server, mode, robots, args.rate, args.duration, rng)
                    print(f"{mode}: {robots} robots done (rtt p50 {point.rtt_p50_ms:.2f} ms)", flush=True)
                    points.append(point)
            finally:
                server.stop()
    _print_table(points, args.rate)
    return {
        "benchmark": "bench_robot",
        "settings": {
            "duration_s": args.duration,
            "rate_hz": args.rate,
            "robots": args.robots,
            "batched": modes[0][1],
            "unbatched": modes[1][1],
            "policy": "demo (DROID)",
            "warmup_steps_per_robot": WARMUP_STEPS,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "points": [asdict(p) for p in points],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per point (default 30)")
    parser.add_argument("--rate", type=float, default=15.0, help="control rate per robot in Hz (DROID: 15)")
    parser.add_argument("--robots", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-batch", type=int, default=32, help="batched mode's robot.max_batch")
    parser.add_argument("--window-ms", type=float, default=2.0, help="batched mode's robot.batch_window_ms")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="server's robot.torch_threads (1: the robots share this machine's cores)",
    )
    parser.add_argument("--seed", type=int, default=0, help="robot phase offsets")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_robot.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
