"""Soak: the real server (``rtserve serve --engine loopback`` in its own process) under mixed
load for ``--duration`` seconds (default 10 minutes), watched for leaks and drift (issue 17).

Load, all at once:

* ``--sessions`` full-duplex sessions on ``WS /v1/realtime?duplex=1``, each sending one 80 ms
  PCM16 chunk every 80 ms on an absolute schedule; each chunk is numbered and the loopback
  engine echoes it, so latency is measured per chunk and a chunk that never comes back is lost
  (a session's last chunk is awaited, bounded, before the count);
* ``--robots`` robots with the real ``openpi-client`` (``WebsocketClientPolicy``, one thread
  each) in a closed loop at ``--robot-hz``;
* HTTP traffic at ``--http-rps``: ``/health``, ``/v1/models``, ``/metrics``, a chat completion
  (503 ``model_unavailable`` on the loopback engine, which has no LLM: expected) and a malformed
  chat body (400: expected);
* churn at ``--churn-per-s``: short connections that connect, do one exchange and leave, in
  turn a realtime session dropped without a goodbye, a duplex session closed with
  ``session.close``, a Moshi ``/api/chat`` conversation (one Ogg page) and an openpi robot.

Every ``--sample-s`` the server's processes (supervisor, workers, engine process) are sampled
for RSS and open file descriptors. Reported: RSS and descriptors at start, after warm-up and at
the end, per process; p99 latency of each traffic kind in the first and the last minute (the
drift); lost chunks; errors by type (anything unexpected); and, once the load has stopped,
what the server still holds (sessions, slots, connections: all must drop to zero).

Lost chunks are told apart by where they were held up. The load generator is one process on
the same loaded machine: when its event loop stalls, the chunks due meanwhile go out late, in
a burst. A lost chunk that left the generator later than the server's input bound
(``--input-backlog-ms``, the server's ``lockstep.max_input_backlog_ms``) less two frames could
be pushed out by that bound however well the server kept time: it is counted as lost after a
load-generator stall, and the generator's own loop stalls and send lag are reported. Every
other lost chunk is the server's,
and so are its engine counters (input dropped over the bound, output dropped for a slow
reader) and its event-loop lag (``rtserve_event_loop_lag_seconds``). Only the server's losses
fail the run.

    .venv/bin/python benchmarks/bench_soak.py                     # 10 minutes
    .venv/bin/python benchmarks/bench_soak.py --duration 120      # 2-minute smoke
    .venv/bin/python benchmarks/bench_soak.py --input-backlog-ms 320   # the former 4-frame bound
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import sphn
from bench_realtime import (  # benchmarks/ is on sys.path: scripts run from there
    ENGINE_COUNTERS,
    FRAME,
    PERIOD_S,
    RATE,
    append_message,
    echoed_seqs,
)
from server_process import ServerProcess, scrape

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first

from openpi_client.websocket_client_policy import WebsocketClientPolicy  # noqa: E402

from rtserve.config import LockstepConfig  # noqa: E402
from rtserve.engines.policy.demo import example_observation  # noqa: E402

DRIFT_WINDOW_S = 60.0  # "first minute" vs "last minute" (a quarter of the run when shorter than 4 minutes)
# RSS "after warm-up" is sampled past the duplex journals' replay window (sessions.resume_replay_ttl_s,
# 60 s): until then every duplex session's journal grows by design.
WARMUP_S = 90.0
LEFTOVER_GAUGES = (
    "rtserve_sessions_slots_in_use",
    "rtserve_lockstep_occupied_slots",
    "rtserve_realtime_connections",
    "rtserve_robot_connections",
    "rtserve_moshi_open_connections",
)
WAIT_S = 10.0
LOOP_PROBE_S = 0.05  # the load generator's own event-loop lag probe
CLIENT_STALL_S = 0.25  # generator loop lags above this are listed
SERVER_LAG_BUCKETS = ("0.32", "0.64", "1.28")  # rtserve_event_loop_lag_seconds buckets reported


@dataclass
class Load:
    """What the clients saw; written from the event loop and the robot threads (appends only)."""

    latency: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))  # kind -> (t, ms)
    errors: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    chunks_sent: int = 0
    chunks_lost: int = 0  # by the server
    # A chunk that left the load generator this late can be dropped by the server's input bound
    # even when the server kept time (the bound less two frames: what may already stand there).
    client_held_s: float = 0.0
    chunks_lost_client_held: int = 0  # sent more than client_held_s late by the load generator
    send_lag_ms: list[float] = field(default_factory=list)  # every chunk: how late it left the generator
    client_stalls_ms: list[float] = field(default_factory=list)  # generator loop lags above CLIENT_STALL_S

    def record(self, kind: str, started: float) -> None:
        now = time.monotonic()
        self.latency[kind].append((now, (now - started) * 1000))
        self.counts[kind] += 1


@dataclass
class ProcessSample:
    pid: int
    name: str
    rss_mib: float
    fds: int


def sample_processes(server: ServerProcess) -> list[ProcessSample]:
    out = []
    for pid in server.pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        name = " ".join(part.decode(errors="replace") for part in cmdline[1:4])
        out.append(ProcessSample(pid, name[:60], rss_kb / 1024, fds))
    return out


# ----------------------------------------------------------------------------- traffic


async def duplex_session(http: aiohttp.ClientSession, url: str, load: Load, phase: float, stop: asyncio.Event) -> None:
    """One paced duplex session for the whole run; reconnects (counted as an error) if it dies."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        sent: dict[int, float] = {}
        echoed: set[int] = set()
        echo = asyncio.Event()
        send_lag: list[float] = []  # seconds, by seq
        try:
            async with http.ws_connect(url, max_msg_size=0) as ws:
                created = json.loads((await asyncio.wait_for(ws.receive(), WAIT_S)).data)
                if created.get("type") != "session.created":
                    load.errors[f"duplex refused: {created.get('error', {}).get('code')}"] += 1
                    await asyncio.sleep(1.0)
                    continue

                async def receive(sent: dict[int, float], echoed: set[int], echo: asyncio.Event) -> None:
                    async for message in ws:
                        if message.type is not aiohttp.WSMsgType.TEXT:
                            break
                        event = json.loads(message.data)
                        if event["type"] == "response.output_audio.delta":
                            seqs = echoed_seqs(event["delta"])
                            echoed.update(seqs)
                            echo.set()
                            if seqs and max(seqs) in sent:
                                at = sent.pop(max(seqs))
                                load.latency["duplex echo"].append((time.monotonic(), (time.monotonic() - at) * 1000))
                        elif event["type"] == "error":
                            load.errors[f"duplex error event: {event['error'].get('code')}"] += 1
                    if not stop.is_set():
                        load.errors[f"duplex closed by server: {ws.close_code}"] += 1

                receiver = asyncio.create_task(receive(sent, echoed, echo))
                seq, due = 0, loop.time() + phase
                while not stop.is_set() and not receiver.done():
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    send_lag.append(loop.time() - due)
                    await ws.send_str(append_message(seq, FRAME))
                    sent[seq] = time.monotonic()
                    load.chunks_sent += 1
                    seq, due = seq + 1, due + PERIOD_S
                # The echo is in order: once the last chunk is back, every other one is back or lost.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WAIT_S):
                        while seq and seq - 1 not in echoed and not receiver.done():
                            echo.clear()
                            await echo.wait()
                lost = set(range(seq)) - echoed
                held = sum(send_lag[s] > load.client_held_s for s in lost)
                load.chunks_lost += len(lost) - held
                load.chunks_lost_client_held += held
                load.send_lag_ms.extend(1000 * lag for lag in send_lag)
                await ws.send_json({"type": "session.close"})  # frees the slot now, not after the resume grace
                receiver.cancel()
                await asyncio.gather(receiver, return_exceptions=True)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            load.errors[f"duplex {type(exc).__name__}"] += 1
            await asyncio.sleep(1.0)


def robot(url: str, index: int, hz: float, load: Load, stop: threading.Event) -> None:
    """One openpi-client robot in a closed loop; a failure is counted and the robot reconnects."""
    observation = example_observation(index)
    while not stop.is_set():
        try:
            policy = WebsocketClientPolicy(url)
            due = time.monotonic()
            while not stop.is_set():
                started = time.monotonic()
                policy.infer(observation)
                load.record("robot infer", started)
                due += 1 / hz
                stop.wait(max(0.0, due - time.monotonic()))
            policy._ws.close()  # openpi-client has no public close
        except Exception as exc:  # noqa: BLE001 - a soak counts every failure by type and goes on
            load.errors[f"robot {type(exc).__name__}"] += 1
            stop.wait(1.0)


HTTP_REQUESTS: list[tuple[str, str, object, frozenset[int]]] = [
    ("GET", "/health", None, frozenset({200})),
    ("GET", "/v1/models", None, frozenset({200})),
    ("GET", "/metrics", None, frozenset({200})),
    (
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        frozenset({200, 503}),
    ),  # 503 model_unavailable: the loopback engine has no LLM
    ("POST", "/v1/chat/completions", {"messages": "not a list"}, frozenset({400})),
]


async def http_traffic(http: aiohttp.ClientSession, base: str, rps: float, load: Load, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    due, n = loop.time(), 0
    while not stop.is_set():
        method, path, body, expected = HTTP_REQUESTS[n % len(HTTP_REQUESTS)]
        n += 1
        started = time.monotonic()
        try:
            async with http.request(method, base + path, json=body, timeout=aiohttp.ClientTimeout(total=WAIT_S)) as r:
                await r.read()
                if r.status not in expected:
                    load.errors[f"http {method} {path} {r.status}"] += 1
            load.record("http", started)
        except (TimeoutError, aiohttp.ClientError) as exc:
            load.errors[f"http {type(exc).__name__}"] += 1
        due += 1 / rps
        await asyncio.sleep(max(0.0, due - loop.time()))


async def watch_loop(load: Load, stop: asyncio.Event) -> None:
    """The load generator's own event-loop lag: how late a short timer fires."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + LOOP_PROBE_S
        await asyncio.sleep(LOOP_PROBE_S)
        if (lag := loop.time() - due) > CLIENT_STALL_S:
            load.client_stalls_ms.append(1000 * lag)


class Churn:
    """Short connections, one kind after another."""

    def __init__(self, http: aiohttp.ClientSession, ws_base: str, load: Load) -> None:
        self.http, self.ws_base, self.load = http, ws_base, load
        writer = sphn.OpusStreamWriter(RATE)
        noise = (0.1 * np.random.default_rng(0).standard_normal(FRAME)).astype(np.float32)
        self.ogg = writer.append_pcm(noise) + writer.append_pcm(noise)

    async def realtime_dropped(self) -> None:
        async with self.http.ws_connect(self.ws_base + "/v1/realtime") as ws:
            await self._expect(ws, "session.created")
            await ws.send_str(append_message(0, FRAME))
        # leaving without a goodbye: the server must notice and free everything

    async def duplex_closed(self) -> None:
        async with self.http.ws_connect(self.ws_base + "/v1/realtime?duplex=1") as ws:
            await self._expect(ws, "session.created")
            await ws.send_json({"type": "session.close"})
            async for _ in ws:  # until the server closes
                pass

    async def moshi_chat(self) -> None:
        async with self.http.ws_connect(self.ws_base + "/api/chat") as ws:
            handshake = await asyncio.wait_for(ws.receive(), WAIT_S)
            if handshake.data != b"\x00":
                raise ValueError(f"no handshake: {handshake.type}")
            await ws.send_bytes(b"\x01" + self.ogg)

    async def robot(self) -> None:
        async with self.http.ws_connect(self.ws_base + "/v1/realtime/robot/openpi") as ws:
            metadata = await asyncio.wait_for(ws.receive(), WAIT_S)
            if metadata.type is not aiohttp.WSMsgType.BINARY:
                raise ValueError(f"no server config: {metadata.type}")

    async def _expect(self, ws: aiohttp.ClientWebSocketResponse, kind: str) -> None:
        event = json.loads((await asyncio.wait_for(ws.receive(), WAIT_S)).data)
        if event.get("type") != kind:
            raise ValueError(f"{kind} expected, got {event.get('type')} {event.get('error', {}).get('code')}")

    async def run(self, per_s: float, stop: asyncio.Event) -> None:
        kinds = [self.realtime_dropped, self.duplex_closed, self.moshi_chat, self.robot]
        loop = asyncio.get_running_loop()
        due, n = loop.time(), 0
        while not stop.is_set():
            connect = kinds[n % len(kinds)]
            n += 1
            started = time.monotonic()
            try:
                await asyncio.wait_for(connect(), WAIT_S)
                self.load.record(f"churn {connect.__name__}", started)
            except (TimeoutError, aiohttp.ClientError, ConnectionError, ValueError) as exc:
                self.load.errors[f"churn {connect.__name__}: {type(exc).__name__} {str(exc)[:60]}"] += 1
            due += 1 / per_s
            await asyncio.sleep(max(0.0, due - loop.time()))


# ----------------------------------------------------------------------------- run and report


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    slots = args.sessions + 16  # the steady sessions and the churn's
    server = ServerProcess(
        {
            "RTSERVE_LOCKSTEP__BATCH_SIZE": str(slots),
            "RTSERVE_SESSIONS__MAX_SESSIONS": str(slots),
            "RTSERVE_LOCKSTEP__MAX_INPUT_BACKLOG_MS": str(args.input_backlog_ms),
        },
        name="bench_soak",
        workers=args.workers,
    )
    load = Load(client_held_s=args.input_backlog_ms / 1000 - 2 * PERIOD_S)
    samples: list[tuple[float, list[ProcessSample]]] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await server.wait_ready(http)
            ws_base = server.base.replace("http://", "ws://")
            stop, robots_stop = asyncio.Event(), threading.Event()
            counters_before, client_cpu_before = await scrape(http, server.base), time.process_time()
            load_before = os.getloadavg()
            started = time.monotonic()
            samples.append((0.0, sample_processes(server)))
            tasks = [
                asyncio.create_task(
                    duplex_session(http, ws_base + "/v1/realtime?duplex=1", load, PERIOD_S * i / args.sessions, stop)
                )
                for i in range(args.sessions)
            ]
            tasks.append(asyncio.create_task(http_traffic(http, server.base, args.http_rps, load, stop)))
            tasks.append(asyncio.create_task(Churn(http, ws_base, load).run(args.churn_per_s, stop)))
            tasks.append(asyncio.create_task(watch_loop(load, stop)))
            threads = [
                threading.Thread(
                    target=robot,
                    args=(ws_base + "/v1/realtime/robot/openpi", i, args.robot_hz, load, robots_stop),
                    daemon=True,
                )
                for i in range(args.robots)
            ]
            for thread in threads:
                thread.start()
            while (elapsed := time.monotonic() - started) < args.duration:
                await asyncio.sleep(min(args.sample_s, args.duration - elapsed))
                samples.append((time.monotonic() - started, sample_processes(server)))
                print(
                    f"  {samples[-1][0]:6.0f} s  rss {sum(p.rss_mib for p in samples[-1][1]):7.1f} MiB  "
                    f"fds {sum(p.fds for p in samples[-1][1]):4d}  errors {sum(load.errors.values())}",
                    flush=True,
                )
            client_cpu = (time.process_time() - client_cpu_before) / (time.monotonic() - started)
            load_after = os.getloadavg()
            stop.set()
            robots_stop.set()
            await asyncio.gather(*tasks)
            for thread in threads:
                await asyncio.to_thread(thread.join, WAIT_S)
            counters_after = await scrape(http, server.base)
            leftover = await settle(http, server.base, args.settle_s)
            samples.append((time.monotonic() - started, sample_processes(server)))
    finally:
        server.stop()
    engine = {
        k.removeprefix("rtserve_lockstep_").removesuffix("_total"): counters_after.get(k, 0.0)
        - counters_before.get(k, 0.0)
        for k in ENGINE_COUNTERS
    }
    return report(args, load, samples, leftover) | {
        "engine_counters": engine,
        "client_cpu_pct": 100 * client_cpu,
        "server_loop_lags_over_s": server_loop_lags(counters_before, counters_after),
        "load_average_1_5_15": {
            "before": [round(v, 2) for v in load_before],
            "after": [round(v, 2) for v in load_after],
        },
    }


def server_loop_lags(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """How many of the server's 100 ms loop-lag probes (every process summed) fired later than each bound."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    name = "rtserve_event_loop_lag_seconds_bucket"
    total = delta(f'{name}{{le="+Inf"}}')
    return {bound: total - delta(f'{name}{{le="{bound}"}}') for bound in SERVER_LAG_BUCKETS}


async def settle(http: aiohttp.ClientSession, base: str, within_s: float) -> dict[str, float]:
    """What the server still holds once every client is gone (polled until zero or ``within_s``)."""
    deadline = time.monotonic() + within_s
    while True:
        metrics = await scrape(http, base)
        held = {
            name: sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))
            for name in LEFTOVER_GAUGES
        }
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        await asyncio.sleep(0.5)


def p99_drift(points: list[tuple[float, float]], run_start: float, duration_s: float) -> dict[str, float]:
    window = min(DRIFT_WINDOW_S, duration_s / 4)
    first = [ms for t, ms in points if t - run_start < window]
    last = [ms for t, ms in points if t - run_start >= duration_s - window]

    def p99(values: list[float]) -> float:
        return float(np.percentile(values, 99)) if values else float("nan")

    return {
        "window_s": window,
        "first_p99_ms": p99(first),
        "last_p99_ms": p99(last),
        "all_p50_ms": float(np.percentile([ms for _, ms in points], 50)) if points else float("nan"),
        "count": len(points),
    }


def report(
    args: argparse.Namespace, load: Load, samples: list[tuple[float, list[ProcessSample]]], leftover: dict[str, float]
) -> dict[str, Any]:
    run_start = min((t for points in load.latency.values() for t, _ in points), default=0.0)
    warm_at, warm = next(((t, s) for t, s in samples if t >= min(WARMUP_S, args.duration / 2)), samples[-1])
    end_at = samples[-2][0] if len(samples) > 2 else samples[-1][0]  # the last sample under load

    def totals(ps: list[ProcessSample]) -> dict[str, float]:
        return {"rss_mib": round(sum(p.rss_mib for p in ps), 1), "fds": sum(p.fds for p in ps)}

    return {
        "benchmark": "bench_soak",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "server": {
            "start": totals(samples[0][1]),
            "after_warmup": totals(warm) | {"t_s": round(warm_at, 1)},
            "end": totals(samples[-1][1]),
            "rss_growth_after_warmup_mib_per_min": round(
                60 * (totals(samples[-2][1])["rss_mib"] - totals(warm)["rss_mib"]) / max(1.0, end_at - warm_at), 2
            ),
            "per_process": {"start": [asdict(p) for p in samples[0][1]], "end": [asdict(p) for p in samples[-1][1]]},
            "timeline": [{"t_s": round(t, 1), **totals(ps)} for t, ps in samples],
        },
        "latency": {kind: p99_drift(points, run_start, args.duration) for kind, points in load.latency.items()},
        "counts": dict(load.counts) | {"duplex chunks sent": load.chunks_sent},
        "duplex_chunks_lost": load.chunks_lost,
        "duplex_chunks_lost_after_client_stall": load.chunks_lost_client_held,
        "client_held_threshold_ms": round(1000 * load.client_held_s),
        "client_send_lag_ms": {
            "p99": float(np.percentile(load.send_lag_ms, 99)) if load.send_lag_ms else 0.0,
            "max": max(load.send_lag_ms, default=0.0),
            "over_threshold": sum(lag > 1000 * load.client_held_s for lag in load.send_lag_ms),
        },
        "client_loop_stalls_ms": sorted(load.client_stalls_ms, reverse=True)[:20],
        "client_loop_stall_count": len(load.client_stalls_ms),
        "errors": dict(load.errors.most_common()),
        "held_after_load": leftover,
    }


def print_table(result: dict[str, Any]) -> None:
    s, lag = result["server"], result["client_send_lag_ms"]
    rows = [
        (
            "server RSS start / after warm-up / end",
            f"{s['start']['rss_mib']} / {s['after_warmup']['rss_mib']} / {s['end']['rss_mib']} MiB",
        ),
        ("server RSS growth after warm-up (under load)", f"{s['rss_growth_after_warmup_mib_per_min']} MiB/min"),
        (
            "server fds start / after warm-up / end",
            f"{s['start']['fds']} / {s['after_warmup']['fds']} / {s['end']['fds']}",
        ),
        *[
            (f"fds / RSS per process: {p['name']}", f"{p['fds']} fds, {p['rss_mib']:.1f} MiB (end)")
            for p in s["per_process"]["end"]
        ],
        *[
            (
                f"{kind} p99 first / last {d['window_s']:.0f} s (p50, n)",
                f"{d['first_p99_ms']:.1f} / {d['last_p99_ms']:.1f} ms ({d['all_p50_ms']:.1f} ms, {d['count']})",
            )
            for kind, d in result["latency"].items()
        ],
        (
            "duplex chunks sent / lost by the server",
            f"{result['counts']['duplex chunks sent']} / {result['duplex_chunks_lost']}",
        ),
        (
            f"duplex chunks lost after a load-generator stall (sent > {result['client_held_threshold_ms']} ms late)",
            f"{result['duplex_chunks_lost_after_client_stall']}",
        ),
        (
            "load generator: send lag p99 / max; chunks sent over that",
            f"{lag['p99']:.1f} / {lag['max']:.0f} ms; {lag['over_threshold']}",
        ),
        (
            f"load generator: loop stalls > {CLIENT_STALL_S * 1000:.0f} ms (longest)",
            f"{result['client_loop_stall_count']} ({max(result['client_loop_stalls_ms'], default=0):.0f} ms)",
        ),
        (
            "server: loop-lag probes later than " + " / ".join(f"{b} s" for b in SERVER_LAG_BUCKETS),
            " / ".join(f"{v:.0f}" for v in result["server_loop_lags_over_s"].values()),
        ),
        (
            "engine: underruns / dropped in / dropped out / overruns / catch-up / skipped",
            " / ".join(
                f"{result['engine_counters'][k]:.0f}"
                for k in (
                    "underruns",
                    "dropped_input_frames",
                    "dropped_output_frames",
                    "overruns",
                    "catch_up_ticks",
                    "skipped_deadlines",
                )
            ),
        ),
        (
            "engine: input trimmed (repaid or drift-trimmed, quietest first)",
            f"{result['engine_counters']['trimmed_input_samples'] / RATE:.1f} s of audio",
        ),
        (
            "machine load average 1/5/15 min before / after",
            f"{' '.join(map(str, result['load_average_1_5_15']['before']))} / "
            f"{' '.join(map(str, result['load_average_1_5_15']['after']))} ({os.cpu_count()} cores)",
        ),
        ("load generator CPU (one core = 100 %)", f"{result['client_cpu_pct']:.0f} %"),
        ("errors", ", ".join(f"{k}: {v}" for k, v in result["errors"].items()) or "none"),
        (
            "held after the load stopped",
            ", ".join(f"{k.removeprefix('rtserve_')} {v:g}" for k, v in result["held_after_load"].items()),
        ),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'metric':<{width}} | value |")
    print(f"| {'-' * width} | ----- |")
    for name, value in rows:
        print(f"| {name:<{width}} | {value} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--sessions", type=int, default=32, help="paced full-duplex sessions")
    parser.add_argument("--robots", type=int, default=8, help="openpi-client robots")
    parser.add_argument("--robot-hz", type=float, default=15.0, help="each robot's control rate (DROID: 15 Hz)")
    parser.add_argument("--http-rps", type=float, default=5.0, help="HTTP requests per second")
    parser.add_argument("--churn-per-s", type=float, default=2.0, help="short connections per second")
    parser.add_argument("--workers", type=int, default=1, help="front-end worker processes of the server")
    parser.add_argument(
        "--input-backlog-ms",
        type=float,
        default=LockstepConfig().max_input_backlog_ms,
        help="the server's lockstep.max_input_backlog_ms",
    )
    parser.add_argument("--sample-s", type=float, default=10.0, help="process sampling period")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=15.0,
        help="after the load, how long the server may take to release everything",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_soak.json"))
    args = parser.parse_args()
    result = asyncio.run(soak(args))
    print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    clean = not result["errors"] and result["duplex_chunks_lost"] == 0 and not any(result["held_after_load"].values())
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
