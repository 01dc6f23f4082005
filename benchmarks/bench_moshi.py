"""Paced Moshi clients against the real server's ``/api/chat``, on the loopback engine or,
with ``--engine moshi --config FILE``, on the real Moshi engine (``moshi_engine`` section of
FILE: weights or ``random_weights``, device, dtype, kv_cache; the batch is set to N).

For each client count N this starts ``rtserve serve --engine ENGINE`` (batch = N) in its
own process and runs N clients for ``--duration`` seconds. A client speaks what Moshi's
own CLI does: sphn Ogg-Opus pages, one 80 ms frame sent every 80 ms on an absolute
schedule (clients start at spread phases, like independent callers). To keep the load
generator light, the stream is sphn-encoded once before the clock starts and the echo is
timestamped on arrival and sphn-decoded afterwards. Clients send band-limited noise, so
where its audio lands in the echo is found by cross-correlation (per echoed page), whatever
silence or frame slips the server inserts.

Reported per N (steady-state window: after ``--warmup`` s, before the senders stop):

* server path p50/p99 (any lockstep engine; a server histogram, so it holds for a model whose
  output is no echo): for every agent frame whose tick stepped new input, from the moment
  the newest input sample that tick stepped was decoded and handed to the engine session
  (front end) to the moment that tick's Ogg-Opus page was written to the socket: the wait
  for the tick (uplink to the engine process, tick phase, any standing backlog), the tick
  (Mimi encode, LM, Mimi decode), the hand-off back and the Opus encode. The engine says,
  with each frame, how many input samples were gone from its backlog after that tick; the
  front end stamped every push. Not in it: the client's socket and the Opus decode on the
  way in (about a millisecond); on the loopback engine the echo latency below includes
  them (4 clients on 2 CPU cores: path p50/p99 46/88 ms against echo 51/83 ms, within the
  histogram's 10 ms buckets);
* its parts, wait and back p50/p99: the newest input sample -> its tick due (the tick phase and
  any standing backlog), and tick due -> the frame read from the engine's hand-off (the tick,
  the engine link back, the worker's turn to read it); the egress histogram is the rest;
* tick and step p50/p99: the lockstep's histograms (whole tick; the batched model step);
* latency (loopback only): for every echoed 80 ms page, its arrival time minus the send time of the
  newest input audio it carries, minus the loopback delay: what the server path adds
  (tick phase wait, Opus decode/encode incl. codec lookahead, queues, sockets); p50/p99;
* egress p50/p99: engine frame produced -> bytes written, from the server's histogram;
* underruns: live-slot ticks stepped with silence because a frame was not there in time;
  silence: all the silence stepped for streams in cadence, partial frames' padding included
  (a page that came partly late is no underrun), nan for a server without that counter
  (server counter), as a share of live ticks;
* lateness: arrival of agent page k minus its ideal cadence time (first page + k*80 ms,
  anchored at the earliest page); p99 and pages > 80 ms late (a one-frame playout
  buffer would starve);
* drops (server input backlog + per-connection output), skipped tick deadlines, send lag
  p99 (client timer slip: checks the load generator itself kept up), server CPU (share of
  one core), and (loopback) the share of echoed pages whose input could be located.

    .venv/bin/python benchmarks/bench_moshi.py                  # N = 8, 32, 64; 30 s each
    .venv/bin/python benchmarks/bench_moshi.py --duration 5     # quick look
    python benchmarks/bench_moshi.py --engine moshi --config moshi.yaml --clients 128 256 \
        --workers 8 --client-procs 4                            # the real engine on a GPU
    .venv/bin/python benchmarks/bench_moshi.py --clients 32 --workers 2 --step-ms 40
                                                  # the loopback as slow as a real step (its served path)

``--client-procs K`` runs the clients in K load-generator processes (``load_shards.py``):
one process sending 256 paced streams nears a core of its own, and its timer slip then
reads as server latency; the table reports the busiest load-generator process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import msgpack
import numpy as np
import numpy.typing as npt
import pyspy
from load_shards import (
    ShardResult,
    gather_shards,
    in_processes,
    merge_logs,
    run_shard,
    split,
)  # benchmarks/ is on sys.path
from server_process import ENGINE_PROCESS, ServerProcess, histogram_max, histogram_quantile, scrape

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first

from rtserve.config import ServerConfig, load_config  # noqa: E402  (what the server child runs with)

RATE = 24_000
FRAME = 1920
PERIOD_S = FRAME / RATE
SILENCE = "rtserve_lockstep_silence_stepped_seconds_total"
FIRST_SEARCH_S = 3.0  # how far back the first echoed page may lie
SEARCH_FRAMES = 16  # how much further back than the previous page an echoed page may lie
MAX_MISSES = 4  # pages in a row not found near the previous one before searching everything again
MIN_SCORE = 0.5  # normalized correlation below which a page's location is not trusted


@dataclass
class ClientLog:
    send_times: list[float] = field(default_factory=list)  # loop time each frame left
    send_lag_ms: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # per received audio page
    pages: list[bytes] = field(default_factory=list)
    signal: npt.NDArray[np.float32] | None = None
    error: str | None = None


@dataclass
class Point:
    workers: int
    clients: int
    duration_s: float
    server_path_p50_ms: float
    server_path_p99_ms: float
    path_wait_p50_ms: float  # the path's parts: newest input -> its tick due
    path_wait_p99_ms: float
    path_back_p50_ms: float  # tick due -> frame read from the hand-off (tick + the way back)
    path_back_p99_ms: float
    tick_p50_ms: float
    tick_p99_ms: float
    step_p50_ms: float
    step_p99_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    egress_p50_ms: float
    egress_p99_ms: float
    underruns: int
    live_ticks: int
    underrun_pct: float
    lateness_p50_ms: float
    lateness_p99_ms: float
    late_pages: int
    pages: int
    dropped_input: int
    silence_stepped_ms: float  # stepped for streams in cadence: underruns and partial frames' padding
    trimmed_input_ms: float  # standing latency trimmed away, over all sessions
    dropped_output: int
    skipped_ticks: int
    send_lag_p99_ms: float
    aligned_pages_pct: float
    server_cpu_pct: float
    busiest_process_pct: float  # the busiest server process (one core = 100 %): a saturated one is the limit
    engine_process_pct: float  # the engine process (with one worker: the whole server)
    client_cpu_pct: float  # the load generator, all its processes
    busiest_client_pct: float  # its busiest process: near 100 % it, not the server, is the limit
    loop_lag_max_ms: float  # worst event-loop stall of any server process (bucket bound; 0: none over 1 ms)
    engine_loop_lag_max_ms: float  # the same, of the engine process alone
    tick_late_max_ms: float  # worst engine tick start past its deadline (bucket bound)
    full_gc_max_ms: float  # longest full garbage collection of any server process (bucket bound)
    errors: int


def noise(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    spectrum[(freqs < 150) | (freqs > 4000)] = 0
    signal_ = np.fft.irfft(spectrum, n)
    scaled: npt.NDArray[np.float64] = 0.25 * signal_ / np.abs(signal_).max()
    return scaled.astype(np.float32)


def encode_stream(signal_: npt.NDArray[np.float32], saved: Path | None) -> list[bytes]:
    """The client's Ogg-Opus messages, one per 80 ms frame, encoded before the clock starts so
    the load generator only sends bytes on time. With ``saved``: read from that file when it
    holds this signal's pages, else encoded and written there, so a machine without sphn (the
    GPU host's first call) sends the very pages sphn wrote elsewhere."""
    if saved is not None and saved.exists():
        held = msgpack.unpackb(saved.read_bytes())
        if held["samples"] == len(signal_):
            pages: list[bytes] = held["pages"]
            return pages
    import sphn  # only where the stream is encoded or an echo decoded

    writer = sphn.OpusStreamWriter(RATE)
    pages = [writer.append_pcm(signal_[j * FRAME : (j + 1) * FRAME]) for j in range(len(signal_) // FRAME)]
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_bytes(msgpack.packb({"samples": len(signal_), "pages": pages}))
    return pages


def decode_stream(pages: list[bytes]) -> list[npt.NDArray[np.float32]]:
    """Agent audio per received page (decoded after the run: same PCM, no client CPU during it)."""
    import sphn

    reader = sphn.OpusStreamReader(RATE)
    out = []
    for page in pages:
        pcm = reader.append_bytes(page)
        out.append(np.zeros(0, np.float32) if pcm is None else pcm)
    return out


async def run_client(
    http: aiohttp.ClientSession, url: str, messages: list[bytes], start_at: float, log: ClientLog
) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with http.ws_connect(url, max_msg_size=0) as ws:
            handshake = await ws.receive(timeout=30)
            if handshake.type is not aiohttp.WSMsgType.BINARY or handshake.data != b"\x00":
                raise RuntimeError(f"no handshake: {handshake.type} {handshake.extra or ''}")

            async def receive() -> None:
                async for message in ws:
                    if message.type is aiohttp.WSMsgType.BINARY and message.data[:1] == b"\x01":
                        log.arrivals.append(loop.time())
                        log.pages.append(message.data[1:])

            receiver = asyncio.create_task(receive())
            for j, data in enumerate(messages):
                due = start_at + j * PERIOD_S
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await ws.send_bytes(b"\x01" + data)
                now = loop.time()
                log.send_times.append(now)
                log.send_lag_ms.append((now - due) * 1e3)
            await asyncio.sleep(0.6)  # let the echo of the last frames arrive
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    except Exception as exc:  # noqa: BLE001 - any failure is recorded, reported as an error count
        log.error = f"{type(exc).__name__}: {exc}"


def _lag_in(output: npt.NDArray[np.float32], reference: npt.NDArray[np.float32], lo: int, hi: int) -> tuple[int, float]:
    """Best lag of ``reference`` inside ``output`` within [lo, hi], and its normalized score."""
    lo = max(0, lo)
    hi = min(hi, len(output) - len(reference))
    if hi < lo:
        return -1, 0.0
    segment = output[lo : hi + len(reference)]
    size = 1 << int(np.ceil(np.log2(len(segment) + len(reference))))
    corr = np.fft.irfft(np.fft.rfft(segment, size) * np.conj(np.fft.rfft(reference, size)), size)[: hi - lo + 1]
    best = int(np.argmax(corr))
    window = segment[best : best + len(reference)]
    score = float(np.dot(window, reference) / (np.linalg.norm(window) * np.linalg.norm(reference) + 1e-12))
    return lo + best, score


def analyse(log: ClientLog, window: tuple[float, float], delay_s: float) -> tuple[list[float], int, int]:
    """(echo latencies ms, aligned pages, pages) of one client's steady state (loopback engine).

    Every echoed page that arrived in ``window`` is located in the input on its own, near where
    the previous page was found: an underrun's silence or a trim moves only the pages after it.
    (Aligning 1 s windows instead dropped every window with a trim or slip inside, which is
    where latency stands high, and so read well below the server-path histogram.)"""
    if not log.pages or log.signal is None:
        return [], 0, 0
    chunks = decode_stream(log.pages)
    ends = np.cumsum([len(c) for c in chunks])  # output sample index where each page ends
    arrivals = np.asarray(log.arrivals)
    sent = np.asarray(log.send_times)
    latencies: list[float] = []
    aligned = pages = 0
    offset: int | None = None  # input index minus output index, as the previous aligned page had it
    misses = 0
    for page, chunk in enumerate(chunks):
        if len(chunk) < FRAME // 2 or not window[0] <= arrivals[page] <= window[1]:
            continue
        pages += 1
        start = int(ends[page]) - len(chunk)
        # Latency grows by whole frames (silence stepped on underruns) and shrinks by trims of a
        # few ms a tick; after repeated misses, search the whole span again.
        lo, hi = (
            (-int(FIRST_SEARCH_S * RATE), FRAME)
            if offset is None or misses > MAX_MISSES
            else (offset - SEARCH_FRAMES * FRAME, offset + FRAME)
        )
        position, score = _lag_in(log.signal, chunk, start + lo, start + hi)
        if score < MIN_SCORE:
            misses += 1
            continue
        aligned += 1
        offset, misses = position - start, 0
        j = (position + len(chunk) - 1) // FRAME  # the client frame that carried the page's newest input
        if 0 <= j < len(sent):
            latencies.append((arrivals[page] - sent[j] - delay_s) * 1e3)
    return latencies, aligned, pages


def analyse_logs(logs: list[ClientLog], window: tuple[float, float], delay_s: float) -> tuple[list[float], int, int]:
    """``analyse`` of several clients, summed: one process's share of the (CPU-heavy) alignment."""
    latencies: list[float] = []
    aligned = echoed = 0
    for log in logs:
        lat, ok, total = analyse(log, window, delay_s)
        latencies += lat
        aligned += ok
        echoed += total
    return latencies, aligned, echoed


def cadence_lateness(log: ClientLog, window: tuple[float, float]) -> list[float]:
    """ms each page in ``window`` arrived after its slot on the 80 ms grid (anchored at the earliest)."""
    arrivals = np.asarray(log.arrivals)
    index = np.flatnonzero((arrivals >= window[0]) & (arrivals <= window[1]))
    if len(index) < 2:
        return []
    cadence = arrivals[index] - (index - index[0]) * PERIOD_S
    return list((cadence - cadence.min()) * 1e3)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def run_clients(url: str, messages: list[bytes], starts: list[float]) -> list[ClientLog]:
    logs = [ClientLog() for _ in starts]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(run_client(http, url, messages, start, log) for start, log in zip(starts, logs)))
    return logs


def shard(url: str, messages: list[bytes], starts: list[float], window: tuple[float, float]) -> ShardResult[ClientLog]:
    """One load-generator process: its clients, each at its own phase."""
    return run_shard(lambda: run_clients(url, messages, starts), window)


BATCH_ENV = {"loopback": "RTSERVE_LOCKSTEP__BATCH_SIZE", "moshi": "RTSERVE_MOSHI_ENGINE__BATCH_SIZE"}


async def run_point(args: argparse.Namespace, workers: int, clients: int) -> Point:
    duration_s, warmup_s, delay_frames = args.duration, args.warmup, args.delay_frames
    echo = args.engine == "loopback"
    env = {BATCH_ENV[args.engine]: str(clients)}
    if echo:  # the loopback's settings only: a tree from before ``loopback_step_ms`` refuses the field
        env["RTSERVE_REFERENCE__LOOPBACK_DELAY_FRAMES"] = str(delay_frames)
        env["RTSERVE_REFERENCE__LOOPBACK_STEP_MS"] = str(args.step_ms)
    if args.context_fill is not None:  # the steady state of long conversations (docs/engines.md#context-fill)
        env["RTSERVE_MOSHI_ENGINE__CONTEXT_FILL_FRAMES"] = json.dumps(args.context_fill)
    server = ServerProcess(
        env,
        name="bench_moshi",
        engine=args.engine,
        workers=workers,
        config=args.config,
    )
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_ready(http, timeout_s=args.ready_timeout)
            frames = round(duration_s / PERIOD_S)
            # Every client sends the same encoded stream (connections are independent; encoding
            # it once keeps the load generator light) at its own phase.
            signal_ = noise(frames * PERIOD_S)
            messages = encode_stream(signal_, args.client_stream)
            # Room to start the shard processes and connect everyone first.
            start_at = time.monotonic() + 3.0 + 0.002 * clients
            url = server.base.replace("http", "ws") + "/api/chat"
            window = (start_at + warmup_s + PERIOD_S, start_at + frames * PERIOD_S - 0.2)
            ranges = split(clients, args.client_procs)
            shards = asyncio.create_task(
                gather_shards(
                    shard,
                    [
                        (url, messages, [start_at + PERIOD_S * i / clients for i in indices], window)
                        for indices in ranges
                    ],
                )
            )
            await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
            before, cpu_before = await scrape(http, server.base), server.cpu_by_process()
            spy = args.profile_engine
            profiler = pyspy.start(server.engine_pid(), window[1] - window[0], spy) if spy else None
            await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
            after, cpu_after = await scrape(http, server.base), server.cpu_by_process()
            await asyncio.to_thread(pyspy.report, profiler, spy, f"engine process, N={clients} workers={workers}")
            measured_s = window[1] - window[0]
            results = await shards
    finally:
        server.stop()

    logs = merge_logs(results, ranges, clients)
    lateness = [v for log in logs for v in cadence_lateness(log, window)]
    latencies: list[float] = []
    aligned = echoed = 0
    if echo:  # every echoed page aligned on its own: seconds of CPU per client, so on every core
        for log in logs:
            log.signal = signal_  # what every client sent
        cores = min(len(logs), os.cpu_count() or 1)
        for lat, ok, total in await in_processes(
            analyse_logs, [(logs[k::cores], window, delay_frames * PERIOD_S) for k in range(cores)]
        ):
            latencies += lat
            aligned += ok
            echoed += total

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    underruns = int(delta("rtserve_lockstep_underruns_total"))
    live_ticks = round(measured_s / PERIOD_S) * clients

    def quantile_ms(name: str, q: float) -> float:
        return histogram_quantile(before, after, name, q) * 1e3

    def part_ms(part: str, q: float) -> float:
        return histogram_quantile(before, after, "rtserve_moshi_server_path_part_seconds", q, f'part="{part}"') * 1e3

    return Point(
        workers=workers,
        clients=clients,
        duration_s=duration_s,
        server_path_p50_ms=quantile_ms("rtserve_moshi_server_path_seconds", 0.5),
        server_path_p99_ms=quantile_ms("rtserve_moshi_server_path_seconds", 0.99),
        path_wait_p50_ms=part_ms("wait", 0.5),
        path_wait_p99_ms=part_ms("wait", 0.99),
        path_back_p50_ms=part_ms("back", 0.5),
        path_back_p99_ms=part_ms("back", 0.99),
        tick_p50_ms=quantile_ms("rtserve_lockstep_tick_seconds", 0.5),
        tick_p99_ms=quantile_ms("rtserve_lockstep_tick_seconds", 0.99),
        step_p50_ms=quantile_ms("rtserve_lockstep_step_seconds", 0.5),
        step_p99_ms=quantile_ms("rtserve_lockstep_step_seconds", 0.99),
        latency_p50_ms=_pct(latencies, 50),
        latency_p99_ms=_pct(latencies, 99),
        egress_p50_ms=histogram_quantile(before, after, "rtserve_moshi_egress_latency_seconds", 0.5) * 1e3,
        egress_p99_ms=histogram_quantile(before, after, "rtserve_moshi_egress_latency_seconds", 0.99) * 1e3,
        underruns=underruns,
        live_ticks=live_ticks,
        underrun_pct=100.0 * underruns / max(1, live_ticks),
        lateness_p50_ms=_pct(lateness, 50),
        lateness_p99_ms=_pct(lateness, 99),
        late_pages=int(sum(v > PERIOD_S * 1e3 for v in lateness)),
        pages=len(lateness),
        dropped_input=int(delta("rtserve_lockstep_dropped_input_frames_total")),
        silence_stepped_ms=(
            delta(SILENCE) * 1000 if SILENCE in after else math.nan  # a tree before the counter
        ),
        trimmed_input_ms=delta("rtserve_lockstep_trimmed_input_samples_total") * 1000 / 24_000,
        dropped_output=int(delta("rtserve_lockstep_dropped_output_frames_total")),
        skipped_ticks=int(delta("rtserve_lockstep_skipped_deadlines_total")),
        send_lag_p99_ms=_pct([v for log in logs for v in log.send_lag_ms], 99),
        aligned_pages_pct=100.0 * aligned / max(1, echoed),
        server_cpu_pct=100.0 * (sum(cpu_after.values()) - sum(cpu_before.values())) / measured_s,
        busiest_process_pct=server.busiest_pct(cpu_before, cpu_after, measured_s),
        engine_process_pct=100.0 * delta(ENGINE_PROCESS + "process_cpu_seconds_total") / measured_s,
        client_cpu_pct=100.0 * sum(r.cpu_s for r in results) / measured_s,
        busiest_client_pct=100.0 * max(r.cpu_s for r in results) / measured_s,
        loop_lag_max_ms=histogram_max(before, after, "rtserve_event_loop_lag_seconds") * 1e3,
        engine_loop_lag_max_ms=histogram_max(before, after, ENGINE_PROCESS + "rtserve_event_loop_lag_seconds") * 1e3,
        tick_late_max_ms=histogram_max(before, after, "rtserve_lockstep_tick_lateness_seconds") * 1e3,
        full_gc_max_ms=histogram_max(before, after, "rtserve_gc_pause_seconds", 'generation="2"') * 1e3,
        errors=sum(log.error is not None for log in logs),
    )


def print_table(points: list[Point]) -> None:
    columns = [
        ("workers", 7),
        ("N", 4),
        ("path p50", 8),
        ("path p99", 8),
        ("wait p50", 8),
        ("wait p99", 8),
        ("back p50", 8),
        ("back p99", 8),
        ("tick p50", 8),
        ("tick p99", 8),
        ("step p50", 8),
        ("step p99", 8),
        ("lat p50", 8),
        ("lat p99", 8),
        ("egress p50", 10),
        ("egress p99", 10),
        ("underruns", 16),
        ("late p50", 8),
        ("late p99", 8),
        (">80ms", 9),
        ("silence", 7),
        ("drops", 6),
        ("trim", 7),
        ("skipped", 7),
        ("send p99", 8),
        ("cpu", 5),
        ("busiest", 7),
        ("engine", 6),
        ("client/max", 10),
        ("aligned", 7),
        ("loop lag", 8),
        ("eng lag", 7),
        ("tick late", 9),
        ("full gc", 7),
        ("errors", 6),
    ]
    print(" ".join(f"{name:>{width}}" for name, width in columns))
    for p in points:
        cells = [
            str(p.workers),
            str(p.clients),
            f"{p.server_path_p50_ms:.1f}ms",
            f"{p.server_path_p99_ms:.1f}ms",
            f"{p.path_wait_p50_ms:.1f}ms",
            f"{p.path_wait_p99_ms:.1f}ms",
            f"{p.path_back_p50_ms:.1f}ms",
            f"{p.path_back_p99_ms:.1f}ms",
            f"{p.tick_p50_ms:.1f}ms",
            f"{p.tick_p99_ms:.1f}ms",
            f"{p.step_p50_ms:.1f}ms",
            f"{p.step_p99_ms:.1f}ms",
            f"{p.latency_p50_ms:.1f}ms",
            f"{p.latency_p99_ms:.1f}ms",
            f"{p.egress_p50_ms:.2f}ms",
            f"{p.egress_p99_ms:.2f}ms",
            f"{p.underruns}/{p.live_ticks} {p.underrun_pct:.2f}%",
            f"{p.lateness_p50_ms:.1f}ms",
            f"{p.lateness_p99_ms:.1f}ms",
            f"{p.late_pages}/{p.pages}",
            f"{p.silence_stepped_ms:.0f}ms",
            str(p.dropped_input + p.dropped_output),
            f"{p.trimmed_input_ms:.0f}ms",
            str(p.skipped_ticks),
            f"{p.send_lag_p99_ms:.1f}ms",
            f"{p.server_cpu_pct:.0f}%",
            f"{p.busiest_process_pct:.0f}%",
            f"{p.engine_process_pct:.0f}%",
            f"{p.client_cpu_pct:.0f}/{p.busiest_client_pct:.0f}%",
            f"{p.aligned_pages_pct:.0f}%",
            f"{p.loop_lag_max_ms:.0f}ms",
            f"{p.engine_loop_lag_max_ms:.0f}ms",
            f"{p.tick_late_max_ms:.1f}ms",
            f"{p.full_gc_max_ms:.0f}ms",
            str(p.errors),
        ]
        print(" ".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, columns)))
    print(
        "path: newest input sample a tick stepped, decoded -> that tick's page written (server histogram); "
        "wait / back: its parts before the tick was due and from then until the frame was read "
        "(tick + way back; egress is the rest); "
        "tick/step: lockstep histograms (bucket-interpolated); "
        "lat (loopback): echoed page arrival - send of the newest input it carries - loopback delay (client clock); "
        "egress: engine frame -> socket (server); late: page arrival vs 80 ms cadence; "
        "skipped: engine tick deadlines given up for being more than the input backlog cap behind; "
        "aligned: echoed pages located in the input, each on its own (lat is measured in those); "
        "cpu / busiest / engine: every server process, the busiest one, the engine process (% of one core); "
        "loop lag / eng lag / tick late / full gc: the worst event-loop stall of any server process and of the engine "
        "process, the worst engine tick "
        "start past its deadline and the longest full garbage collection (upper bound of the highest histogram "
        "bucket reached: one stall, however rare)"
    )


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    config = load_config(args.config) if args.config else ServerConfig()
    points = []
    for clients in args.clients:
        for workers in args.workers:  # side by side in one run: the machine is shared and noisy
            point = await run_point(args, workers, clients)
            points.append(point)
            print(f"N={clients} workers={workers}: done", file=sys.stderr)
    print_table(points)
    return {
        "benchmark": "bench_moshi",
        "route": "/api/chat",
        "engine": args.engine,
        "config_file": None if args.config is None else str(args.config),
        "loopback_delay_frames": args.delay_frames,
        "loopback_step_ms": args.step_ms,
        "context_fill_frames": args.context_fill,
        "frame_ms": PERIOD_S * 1e3,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "server_config": {
            "moshi": config.moshi.model_dump(),
            "lockstep": config.lockstep.model_dump(),
            "moshi_engine": config.moshi_engine.model_dump(),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_end": os.getloadavg(),
        },
        "points": [asdict(p) for p in points],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="front-end worker counts to compare (1 = one process; >1 adds an engine process)",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of paced audio per client")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds excluded from the statistics")
    parser.add_argument("--delay-frames", type=int, default=1, help="loopback engine delay")
    parser.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="loopback engine: each step lasts this long (a real model's step, e.g. 60 for the 7B Moshi at 256 "
        "sessions on an H200: its served path on a machine without it)",
    )
    parser.add_argument(
        "--engine",
        choices=sorted(BATCH_ENV),
        default="loopback",
        help="loopback (echo: latency by cross-correlation too) or moshi (the real engine)",
    )
    parser.add_argument("--config", type=Path, help="server YAML config (--engine moshi: its moshi_engine section)")
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the server to load (a 7B model and its CUDA graphs take a while)",
    )
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="load generator processes (one process tops out near 256 paced clients)",
    )
    parser.add_argument(
        "--context-fill",
        type=int,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="--engine moshi: sessions start with LOW..HIGH frames of context (moshi_engine.context_fill_frames), "
        "the steady state of long conversations, e.g. 0 3000 (average 1500)",
    )
    parser.add_argument(
        "--profile-engine",
        type=Path,
        help="py-spy the engine process over each measured window into this raw profile; prints where it went",
    )
    parser.add_argument(
        "--client-stream",
        type=Path,
        help="the clients' encoded pages: read from this file when it holds them for --duration, else "
        "encoded with sphn and written there (made on one machine, a GPU host runs without sphn)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "bench_moshi.json")
    args = parser.parse_args()
    if args.duration <= args.warmup + 1:
        parser.error("--duration must exceed --warmup by more than 1 s")
    if args.engine == "moshi" and args.config is None:
        parser.error("--engine moshi needs --config FILE (its moshi_engine section: weights, device, ...)")
    result = asyncio.run(main_async(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
