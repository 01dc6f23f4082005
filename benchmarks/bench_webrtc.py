"""Concurrent WebRTC calls (``POST /v1/realtime/calls``) against the real server
(``rtserve serve --engine loopback`` in its own process), every candidate on 127.0.0.1.

For each call count N of ``--calls`` (a step up), N aiortc callers place their calls at
once (the browser shape: raw ``application/sdp``), each with a paced 48 kHz microphone that
speaks a tone burst every 2 s; the loopback engine sends it back on the agent's track.
Opus both ways, the resamplers, the paced outbound track and the data channel all run
as in a browser call. Reported per N:

* connect: offer posted -> SDP answer, and offer -> first agent audio frame received
  (ICE + DTLS + the first paced frame), p50 / max;
* echo: tone start on the microphone -> the tone heard on the agent's track, p50;
* server CPU over the steady window (``--duration`` s), total and per call, in % of one core;
* gaps: agent-track RTP timestamp jumps (lost or late-dropped 20 ms frames) and frames that
  arrived over 100 ms after the previous one (both seen by the callers), plus the server's
  own counts: outbound frames paced over 20 ms late (in % of the frames it sent), microphone
  frames dropped, engine underruns. "Held" = every call connected, no RTP gap, no frame
  over 100 ms late at a caller, no microphone frame dropped, and under 1 % of the server's
  frames late (on a shared machine a few scheduling hiccups are not the server's doing).

The callers run in this process (``--client-procs`` spreads them over more), so on a small
machine they compete with the server for the same cores: client CPU is reported too.

    .venv/bin/python benchmarks/bench_webrtc.py --calls 1 2 4 8 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from server_process import ServerProcess, scrape  # benchmarks/ is on sys.path: scripts run from there

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first
from rtserve.web.webrtc.audio_in import frame_to_mono  # noqa: E402
from rtserve.web.webrtc.ice import use_host_addresses  # noqa: E402

RATE = 48000
FRAME = 960
TONE_S = 0.3
BURST_PERIOD_S = 2  # longer than any echo delay: each echo matches its own burst
MAX_LATE_SHARE = 0.01
LATE_ARRIVAL_S = 0.1
SERVER_COUNTERS = {
    "late": "rtserve_webrtc_outbound_late_frames_total",
    "dropped_in": "rtserve_webrtc_inbound_dropped_frames_total",
    "underruns": "rtserve_lockstep_underruns_total",
}


class BurstMicrophone(MediaStreamTrack):
    """Paced 20 ms frames: a 440 Hz burst at the start of every period, silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._start: float | None = None
        self.sent = 0
        self.bursts: list[float] = []  # loop time each burst began
        t = np.arange(int(TONE_S * RATE)) / RATE
        self._tone = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        self._start = self._start or loop.time()
        delay = self._start + self.sent * FRAME / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        offset = (self.sent * FRAME) % (BURST_PERIOD_S * RATE)
        if offset == 0:
            self.bursts.append(loop.time())
        samples = np.zeros(FRAME, np.int16)
        if offset < len(self._tone):
            samples[:] = self._tone[offset : offset + FRAME]
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self.sent * FRAME, fractions.Fraction(1, RATE)
        self.sent += 1
        return frame


@dataclass
class CallLog:
    answer_s: float = float("nan")
    first_audio_s: float = float("nan")
    frames: int = 0
    pts_gaps: int = 0
    late_arrivals: int = 0
    echoes_s: list[float] | None = None
    failed: str = ""


async def one_call(
    http: aiohttp.ClientSession, base: str, measure_from: asyncio.Event, stop: asyncio.Event, log: CallLog
) -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = BurstMicrophone()
    pc.addTrack(mic)
    pc.createDataChannel("oai-events")
    loop = asyncio.get_running_loop()
    echoes_s: list[float] = []
    log.echoes_s = echoes_s
    first_audio = asyncio.Event()

    async def read(track: MediaStreamTrack) -> None:
        last_pts, last_at, loud_since = None, None, -1.0
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame) and frame.pts is not None  # aiortc stamps each received frame
            now = loop.time()
            first_audio.set()
            if measure_from.is_set() and not stop.is_set():
                log.frames += 1
                if last_pts is not None and frame.pts - last_pts > FRAME:
                    log.pts_gaps += (frame.pts - last_pts) // FRAME - 1
                if last_at is not None and now - last_at > LATE_ARRIVAL_S:
                    log.late_arrivals += 1
                loud = float(np.sqrt(np.mean(frame_to_mono(frame) ** 2))) > 0.05
                if loud and loud_since < 0 and mic.bursts:
                    echoes_s.append(now - mic.bursts[-1])
                loud_since = now if loud else -1.0
            last_pts, last_at = frame.pts, now

    pc.on("track", lambda track: readers.append(loop.create_task(read(track))))
    readers: list[asyncio.Task[None]] = []
    try:
        await pc.setLocalDescription(await pc.createOffer())
        t0 = time.monotonic()
        async with http.post(
            f"{base}/v1/realtime/calls", data=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}
        ) as resp:
            if resp.status != 201:
                log.failed = f"{resp.status} {(await resp.text())[:200]}"
                return
            answer = await resp.text()
            call_url = base + resp.headers["Location"]
        log.answer_s = time.monotonic() - t0
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(first_audio.wait(), 30)
        log.first_audio_s = time.monotonic() - t0
        await stop.wait()
        async with http.post(call_url + "/hangup") as resp:
            await resp.read()
    except Exception as exc:  # noqa: BLE001 - a benchmark reports a failed call instead of stopping
        log.failed = log.failed or repr(exc)[:200]
    finally:
        await pc.close()
        for task in readers:
            task.cancel()


@dataclass
class Step:
    calls: int
    held: bool
    failed_calls: int
    answer_p50_ms: float
    answer_max_ms: float
    first_audio_p50_ms: float
    first_audio_max_ms: float
    echo_p50_ms: float
    server_cpu_pct: float
    server_cpu_per_call_pct: float
    client_cpu_pct: float
    pts_gaps: int
    late_arrivals: int
    server_late_frames_pct: float
    server_dropped_mic_frames: float
    engine_underruns: float


def _callers(
    base: str,
    calls: int,
    warmup_s: float,
    duration_s: float,
    results: multiprocessing.Queue[tuple[list[dict[str, Any]], float]],
) -> None:
    """One client process: ``calls`` callers; puts their logs on ``results``."""
    use_host_addresses(["127.0.0.1"])

    async def main() -> list[CallLog]:
        measure_from, stop = asyncio.Event(), asyncio.Event()
        logs = [CallLog() for _ in range(calls)]
        async with aiohttp.ClientSession() as http:
            tasks = [asyncio.create_task(one_call(http, base, measure_from, stop, log)) for log in logs]
            await asyncio.sleep(warmup_s)
            measure_from.set()
            await asyncio.sleep(duration_s)
            stop.set()
            await asyncio.gather(*tasks)
        return logs

    cpu0 = time.process_time()
    logs = asyncio.run(main())
    results.put(([asdict(log) for log in logs], time.process_time() - cpu0))


async def run_step(server: ServerProcess, calls: int, client_procs: int, warmup_s: float, duration_s: float) -> Step:
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[list[dict[str, Any]], float]] = ctx.Queue()
    shares = [calls // client_procs + (i < calls % client_procs) for i in range(client_procs)]
    procs = [ctx.Process(target=_callers, args=(server.base, n, warmup_s, duration_s, results)) for n in shares if n]
    async with aiohttp.ClientSession() as http:
        for proc in procs:
            proc.start()
        await asyncio.sleep(warmup_s)
        before, cpu_before = await scrape(http, server.base), server.cpu_by_process()
        t0 = time.monotonic()
        await asyncio.sleep(duration_s)
        elapsed = time.monotonic() - t0
        after, cpu_after = await scrape(http, server.base), server.cpu_by_process()
        gathered = [await asyncio.to_thread(results.get) for _ in procs]
        for proc in procs:
            proc.join()
        async with asyncio.timeout(30):  # every call ended before the next step
            while (await scrape(http, server.base)).get("rtserve_webrtc_calls", 0) > 0:  # noqa: ASYNC110 - polls the server's metrics
                await asyncio.sleep(0.2)
    logs = [CallLog(**log) for chunk, _ in gathered for log in chunk]
    client_cpu = sum(cpu for _, cpu in gathered)
    ok = [log for log in logs if not log.failed]
    server_cpu = 100 * (sum(cpu_after.values()) - sum(v for pid, v in cpu_before.items() if pid in cpu_after)) / elapsed
    delta = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in SERVER_COUNTERS.items()}

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q) * 1000) if values else float("nan")

    gaps = sum(log.pts_gaps for log in ok)
    late = sum(log.late_arrivals for log in ok)
    late_share = delta["late"] / max(1.0, calls * elapsed / 0.02)
    held = len(ok) == calls and gaps == 0 and late == 0 and late_share < MAX_LATE_SHARE and delta["dropped_in"] == 0
    return Step(
        calls=calls,
        held=held,
        failed_calls=calls - len(ok),
        answer_p50_ms=pct([log.answer_s for log in ok], 50),
        answer_max_ms=pct([log.answer_s for log in ok], 100),
        first_audio_p50_ms=pct([log.first_audio_s for log in ok], 50),
        first_audio_max_ms=pct([log.first_audio_s for log in ok], 100),
        echo_p50_ms=pct([e for log in ok for e in (log.echoes_s or [])], 50),
        server_cpu_pct=server_cpu,
        server_cpu_per_call_pct=server_cpu / max(1, calls),
        client_cpu_pct=100 * client_cpu / (warmup_s + duration_s),
        pts_gaps=gaps,
        late_arrivals=late,
        server_late_frames_pct=100 * late_share,
        server_dropped_mic_frames=delta["dropped_in"],
        engine_underruns=delta["underruns"],
    )


def print_table(steps: list[Step]) -> None:
    header = [
        "calls",
        "held",
        "failed",
        "answer p50/max ms",
        "first audio p50/max ms",
        "echo p50 ms",
        "server CPU % (per call)",
        "client CPU %",
        "gaps (rtp/late)",
        "server late % / mic drops / underruns",
    ]
    rows = [
        [
            str(s.calls),
            "yes" if s.held else "NO",
            str(s.failed_calls),
            f"{s.answer_p50_ms:.0f} / {s.answer_max_ms:.0f}",
            f"{s.first_audio_p50_ms:.0f} / {s.first_audio_max_ms:.0f}",
            f"{s.echo_p50_ms:.0f}",
            f"{s.server_cpu_pct:.0f} ({s.server_cpu_per_call_pct:.1f})",
            f"{s.client_cpu_pct:.0f}",
            f"{s.pts_gaps} / {s.late_arrivals}",
            f"{s.server_late_frames_pct:.1f} / {s.server_dropped_mic_frames:.0f} / {s.engine_underruns:.0f}",
        ]
        for s in steps
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="call counts, in order")
    parser.add_argument("--duration", type=float, default=10.0, help="steady seconds measured per step")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after placing the calls, unmeasured")
    parser.add_argument("--client-procs", type=int, default=1, help="processes the callers are spread over")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_webrtc.json"))
    args = parser.parse_args()
    env = {
        "RTSERVE_WEBRTC__HOST_ADDRESSES": "[127.0.0.1]",
        "RTSERVE_LOCKSTEP__BATCH_SIZE": str(max(args.calls)),
        "RTSERVE_SESSIONS__MAX_SESSIONS": str(max(args.calls) + 1),
        "RTSERVE_WEBRTC__MAX_CALLS": str(max(args.calls) + 1),
    }
    server = ServerProcess(env, engine="loopback", name="bench_webrtc")
    steps: list[Step] = []
    try:

        async def ready() -> None:
            async with aiohttp.ClientSession() as http:
                await server.wait_ready(http)

        asyncio.run(ready())
        for calls in args.calls:
            steps.append(asyncio.run(run_step(server, calls, args.client_procs, args.warmup, args.duration)))
            print_table(steps[-1:])
    finally:
        server.stop()
    print()
    print_table(steps)
    held = [s.calls for s in steps if s.held]
    print(f"largest call count held without gaps: {max(held) if held else 0}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "bench_webrtc",
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "largest_held": max(held) if held else 0,
                "steps": [asdict(s) for s in steps],
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
