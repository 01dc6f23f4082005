"""Concurrent duplex sessions on ``WS /v1/realtime?duplex=1`` against the real server
(``rtserve serve --engine loopback`` in its own process).

Each of ``--sessions`` clients opens a duplex session and sends one ``--append-ms`` chunk
of PCM16 (``input_audio_buffer.append``, 80 ms by default) per period on an absolute schedule
(clients start at spread phases, like independent callers) for ``--duration`` seconds. Every
chunk carries its sequence number in its first samples; the loopback engine returns the
audio bit-exact ``loopback_delay_frames`` frames later, so each
``response.output_audio.delta`` is matched to the chunks it echoes.

Reported over the steady window (after ``--warmup`` s, until the senders stop):

* latency: echo arrival minus the send time of the newest chunk the echo carries (the
  issue's "server path" definition), p50/p99/max. It includes the engine's own loopback
  delay (80 ms per delay frame) and the wait for the next engine tick (for 80 ms chunks,
  uniform over one period, since clients are not phase-locked to the tick); "server path"
  subtracts the loopback delay;
* lost: frames sent in the window that never came back (must be 0); duplicates;
* send lag p99: how late the client's own timer fired (checks the load generator kept up);
* server CPU as a share of one core, and error events received.

    .venv/bin/python benchmarks/bench_realtime.py                 # 64 sessions, 30 s
    .venv/bin/python benchmarks/bench_realtime.py --duration 5    # quick look

``--client-procs K`` runs the sessions in K load-generator processes (``load_shards.py``):
one process sending 256 paced streams nears a core of its own, and its timer slip then
reads as server latency; the table reports the busiest load-generator process.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
from load_shards import ShardResult, gather_shards, merge_logs, run_shard, split  # benchmarks/ is on sys.path
from server_process import ENGINE_PROCESS, ServerProcess, histogram_max, scrape

ROOT = Path(__file__).resolve().parents[1]
RATE = 24_000
FRAME = 1920
PERIOD_S = FRAME / RATE
DRAIN_S = 1.0  # after the senders stop, wait this long for the last echoes
# Loud markers: the server's drift trimming drops the quietest samples first, so the chunk
# numbers must never be the quietest thing in the stream (trims are reported on their own).
MARK = (24242, -24242)
_SEQ_BASE = 8192  # seq digits are stored as 8192 + (0..8191): louder than the 1000-level fill
ENGINE_COUNTERS = (
    "rtserve_lockstep_underruns_total",
    "rtserve_lockstep_dropped_input_frames_total",
    "rtserve_lockstep_dropped_output_frames_total",
    "rtserve_lockstep_overruns_total",
    "rtserve_lockstep_catch_up_ticks_total",
    "rtserve_lockstep_skipped_deadlines_total",
    "rtserve_lockstep_trimmed_input_samples_total",
)


@dataclass
class ClientLog:
    sent: dict[int, float] = field(default_factory=dict)  # seq -> loop time sent
    received: dict[int, float] = field(default_factory=dict)  # seq -> arrival of the echo it is the newest of
    echoed: set[int] = field(default_factory=set)  # every chunk seen in some echo
    duplicates: int = 0
    send_lag_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class Result:
    workers: int
    append_ms: int
    sessions: int
    duration_s: float
    warmup_s: float
    loopback_delay_frames: int
    frames_sent: int
    frames_back: int
    lost: int
    duplicates: int
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    server_path_p50_ms: float
    server_path_p99_ms: float
    queued_ticks_pct: dict[str, float]  # share of echoes by whole ticks waited beyond the loopback delay
    latency_p50_first_last_5s_ms: tuple[float, float]
    send_lag_p99_ms: float
    server_cpu_pct: float
    busiest_process_pct: float  # the busiest server process (one core = 100 %)
    engine_process_pct: float  # the engine process (with one worker: the whole server)
    client_cpu_pct: float  # the load generator, all its processes
    busiest_client_pct: float  # its busiest process: near 100 % it, not the server, is the limit
    loop_lag_max_ms: float  # worst event-loop stall of any server process (bucket bound; 0: none over 1 ms)
    engine_loop_lag_max_ms: float  # the same, of the engine process alone
    gc_max_ms: tuple[float, float]  # longest generation 1 and generation 2 (full) collection, any process
    engine_counters: dict[str, float]  # lockstep counters over the run (underruns, drops, overruns, ...)
    error_events: int
    error_codes: dict[str, int]  # what the errors were (event codes, client-side failures)
    failed_sessions: int


def append_message(seq: int, samples: int) -> str:
    chunk = np.full(samples, 1000, dtype="<i2")
    chunk[:4] = [_SEQ_BASE + (seq & 0x1FFF), _SEQ_BASE + ((seq >> 13) & 0x1FFF), *MARK]
    return '{"type":"input_audio_buffer.append","audio":"' + base64.b64encode(chunk.tobytes()).decode() + '"}'


def echoed_seqs(payload: str) -> list[int]:
    """Sequence numbers of every appended chunk whose start is in this echo (the engine's
    frames need not line up with the client's chunks)."""
    pcm = np.frombuffer(base64.b64decode(payload), dtype="<i2").astype(np.int32)
    if pcm.size < 4:
        return []
    at = np.flatnonzero((pcm[2:-1] == MARK[0]) & (pcm[3:] == MARK[1]))
    return [(int(pcm[i]) - _SEQ_BASE) | ((int(pcm[i + 1]) - _SEQ_BASE) << 13) for i in at]


async def run_client(
    http: aiohttp.ClientSession, url: str, start_at: float, stop_at: float, log: ClientLog, append_s: float
) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with http.ws_connect(url, max_msg_size=0) as ws:
            created = json.loads((await ws.receive()).data)
            if created.get("type") != "session.created":
                log.errors.append(f"no session: {str(created)[:200]}")
                return

            async def receive() -> None:
                async for message in ws:
                    if message.type is not aiohttp.WSMsgType.TEXT:
                        return
                    arrived = loop.time()
                    event = json.loads(message.data)
                    kind = event["type"]
                    if kind == "response.output_audio.delta":
                        seqs = echoed_seqs(event["delta"])
                        for seq in seqs:
                            if seq in log.echoed:
                                log.duplicates += 1
                            log.echoed.add(seq)
                        if seqs:
                            log.received.setdefault(max(seqs), arrived)
                    elif kind == "error":
                        log.errors.append(event["error"]["code"])

            receiver = asyncio.create_task(receive())
            seq, due = 0, start_at
            while due < stop_at:
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                log.send_lag_ms.append(max(0.0, loop.time() - due) * 1000)
                await ws.send_str(append_message(seq, round(append_s * RATE)))
                log.sent[seq] = loop.time()
                seq += 1
                due += append_s
            await asyncio.sleep(DRAIN_S)
            if receiver.done():  # it stopped early: say why
                log.errors.append(f"receiver ended: {receiver.exception()!r}")
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        log.errors.append(f"{type(exc).__name__}: {exc}")


async def run_clients(url: str, starts: list[float], stop_at: float, append_s: float) -> list[ClientLog]:
    logs = [ClientLog() for _ in starts]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(
            *(run_client(http, url, start, stop_at, log, append_s) for start, log in zip(starts, logs))
        )
    return logs


def shard(
    url: str, starts: list[float], stop_at: float, append_s: float, window: tuple[float, float]
) -> ShardResult[ClientLog]:
    """One load-generator process: its sessions, each at its own phase."""
    return run_shard(lambda: run_clients(url, starts, stop_at, append_s), window)


async def run(
    workers: int,
    sessions: int,
    duration_s: float,
    warmup_s: float,
    delay_frames: int,
    append_ms: int,
    client_procs: int,
) -> Result:
    server = ServerProcess(
        {
            "RTSERVE_LOCKSTEP__BATCH_SIZE": str(sessions),
            "RTSERVE_SESSIONS__MAX_SESSIONS": str(sessions),
            "RTSERVE_REFERENCE__LOOPBACK_DELAY_FRAMES": str(delay_frames),
        },
        name="bench_realtime",
        workers=workers,
    )
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_ready(http)
            url = server.base.replace("http://", "ws://") + "/v1/realtime?duplex=1"
            # Room to start the shard processes and open every session before the clock starts.
            start_at = time.monotonic() + 3.0 + sessions * 0.01
            stop_at = start_at + warmup_s + duration_s
            window = (start_at + warmup_s, stop_at)
            ranges = split(sessions, client_procs)
            shards = asyncio.create_task(
                gather_shards(
                    shard,
                    [
                        (url, [start_at + PERIOD_S * i / sessions for i in indices], stop_at, append_ms / 1000, window)
                        for indices in ranges
                    ],
                )
            )
            await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
            cpu_before, counters_before = server.cpu_by_process(), await scrape(http, server.base)
            await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
            cpu_after, counters_after = server.cpu_by_process(), await scrape(http, server.base)
            measured_s = window[1] - window[0]
            results = await shards
    finally:
        server.stop()

    logs = merge_logs(results, ranges, sessions)
    window_start = start_at + warmup_s
    latencies, sent_at, lags = [], [], []
    sent = back = lost = 0
    for log in logs:
        for seq, at in log.sent.items():
            if at < window_start:
                continue
            sent += 1
            if seq not in log.echoed:
                lost += 1
                continue
            back += 1
            arrived = log.received.get(seq)
            if arrived is not None:  # the newest chunk of its echo
                latencies.append((arrived - at) * 1000)
                sent_at.append(at)
        lags.extend(log.send_lag_ms)
    lat = np.array(latencies or [float("nan")])
    sent_times = np.array(sent_at or [float("nan")])
    delay_ms = delay_frames * PERIOD_S * 1000
    ticks = np.floor((lat - delay_ms) / (PERIOD_S * 1000)).astype(int) if latencies else np.zeros(0, int)
    queued = {f"{k}": round(100 * float(np.mean(ticks == k)), 1) for k in range(int(ticks.max(initial=0)) + 1)}
    first = lat[sent_times < window_start + 5]
    last = lat[sent_times >= stop_at - 5]

    def gc_pause_max_ms(generation: int) -> float:
        labels = f'generation="{generation}"'
        return histogram_max(counters_before, counters_after, "rtserve_gc_pause_seconds", labels) * 1e3

    return Result(
        workers=workers,
        append_ms=append_ms,
        sessions=sessions,
        duration_s=duration_s,
        warmup_s=warmup_s,
        loopback_delay_frames=delay_frames,
        frames_sent=sent,
        frames_back=back,
        lost=lost,
        duplicates=sum(log.duplicates for log in logs),
        latency_p50_ms=float(np.percentile(lat, 50)),
        latency_p99_ms=float(np.percentile(lat, 99)),
        latency_max_ms=float(lat.max()),
        server_path_p50_ms=float(np.percentile(lat, 50)) - delay_ms,
        server_path_p99_ms=float(np.percentile(lat, 99)) - delay_ms,
        queued_ticks_pct=queued,
        latency_p50_first_last_5s_ms=(
            float(np.median(first)) if first.size else float("nan"),
            float(np.median(last)) if last.size else float("nan"),
        ),
        send_lag_p99_ms=float(np.percentile(lags, 99)) if lags else float("nan"),
        server_cpu_pct=100 * (sum(cpu_after.values()) - sum(cpu_before.values())) / measured_s,
        busiest_process_pct=server.busiest_pct(cpu_before, cpu_after, measured_s),
        engine_process_pct=100
        * (
            counters_after.get(ENGINE_PROCESS + "process_cpu_seconds_total", 0.0)
            - counters_before.get(ENGINE_PROCESS + "process_cpu_seconds_total", 0.0)
        )
        / measured_s,
        client_cpu_pct=100 * sum(r.cpu_s for r in results) / measured_s,
        busiest_client_pct=100 * max(r.cpu_s for r in results) / measured_s,
        loop_lag_max_ms=histogram_max(counters_before, counters_after, "rtserve_event_loop_lag_seconds") * 1e3,
        engine_loop_lag_max_ms=histogram_max(
            counters_before, counters_after, ENGINE_PROCESS + "rtserve_event_loop_lag_seconds"
        )
        * 1e3,
        gc_max_ms=(gc_pause_max_ms(1), gc_pause_max_ms(2)),
        engine_counters={
            k.removeprefix("rtserve_lockstep_").removesuffix("_total"): counters_after.get(k, 0.0)
            - counters_before.get(k, 0.0)
            for k in ENGINE_COUNTERS
        },
        error_events=sum(len(log.errors) for log in logs),
        error_codes=dict(Counter(e.split(":")[0][:60] for log in logs for e in log.errors)),
        failed_sessions=sum(not log.sent for log in logs),
    )


def print_table(results: list[Result]) -> None:
    """One column per run (worker counts side by side)."""

    def rows(r: Result) -> list[tuple[str, str]]:
        return [
            ("workers / sessions / append", f"{r.workers} / {r.sessions} / {r.append_ms} ms"),
            ("frames sent / back", f"{r.frames_sent} / {r.frames_back}"),
            ("lost / duplicate", f"{r.lost} / {r.duplicates}"),
            ("latency p50 / p99 / max", f"{r.latency_p50_ms:.1f} / {r.latency_p99_ms:.1f} / {r.latency_max_ms:.1f} ms"),
            (
                f"server path p50 / p99 (minus {r.loopback_delay_frames}-frame delay)",
                f"{r.server_path_p50_ms:.1f} / {r.server_path_p99_ms:.1f} ms",
            ),
            ("echoes by extra ticks waited (0, 1, ...)", " / ".join(f"{v:.0f}%" for v in r.queued_ticks_pct.values())),
            ("latency p50 first 5 s / last 5 s", "{:.1f} / {:.1f} ms".format(*r.latency_p50_first_last_5s_ms)),
            (
                "underruns / dropped in / overruns / catch-up",
                " / ".join(
                    f"{r.engine_counters[k]:.0f}"
                    for k in ("underruns", "dropped_input_frames", "overruns", "catch_up_ticks")
                ),
            ),
            (
                "input trimmed (standing latency, all sessions)",
                f"{r.engine_counters['trimmed_input_samples'] * 1000 / RATE:.0f} ms",
            ),
            ("client send lag p99", f"{r.send_lag_p99_ms:.1f} ms"),
            (
                "server CPU all / busiest / engine process",
                f"{r.server_cpu_pct:.0f} / {r.busiest_process_pct:.0f} / {r.engine_process_pct:.0f} % of one core",
            ),
            ("client CPU all / busiest process", f"{r.client_cpu_pct:.0f} / {r.busiest_client_pct:.0f} % of one core"),
            (
                "worst event-loop stall, any server process / engine process",
                f"{r.loop_lag_max_ms:.0f} / {r.engine_loop_lag_max_ms:.0f} ms (highest bucket reached)",
            ),
            ("longest collection, generation 1 / 2 (full)", f"{r.gc_max_ms[0]:.1f} / {r.gc_max_ms[1]:.1f} ms"),
            ("error events / failed sessions", f"{r.error_events} / {r.failed_sessions}"),
            ("error codes", ", ".join(f"{k} {v}" for k, v in r.error_codes.items()) or "-"),
        ]

    table = [rows(r) for r in results]
    names = [name for name, _ in table[0]]
    width = max(len(n) for n in names)
    cols = [max(len(v) for _, v in col) for col in table]
    print(
        "| " + " | ".join([f"{'metric':<{width}}", *(f"{'run ' + str(i + 1):<{w}}" for i, w in enumerate(cols))]) + " |"
    )
    print("| " + " | ".join(["-" * width, *("-" * w for w in cols)]) + " |")
    for k, name in enumerate(names):
        print("| " + " | ".join([f"{name:<{width}}", *(f"{col[k][1]:<{w}}" for col, w in zip(table, cols))]) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="front-end worker counts to compare side by side (1 = one process)",
    )
    parser.add_argument(
        "--append-ms",
        type=int,
        default=80,
        choices=(20, 40, 80),
        help="audio per input_audio_buffer.append (each sent on its own schedule)",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="steady-state seconds measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent before measuring")
    parser.add_argument("--delay-frames", type=int, default=1, help="loopback delay of the server's engine")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="load generator processes (one process tops out near 256 paced sessions)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_realtime.json"))
    args = parser.parse_args()
    results = [
        asyncio.run(
            run(
                workers, args.sessions, args.duration, args.warmup, args.delay_frames, args.append_ms, args.client_procs
            )
        )
        for workers in args.workers
    ]
    print_table(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "bench_realtime",
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "results": [asdict(r) for r in results],
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0 if all(r.lost == 0 and r.failed_sessions == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
