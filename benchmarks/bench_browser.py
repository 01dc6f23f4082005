"""The voice page in headless Chromium against the real server (``rtserve serve`` in its own
process, every ICE candidate on 127.0.0.1): how long a user waits after pressing Connect.

For each transport (WebRTC, the WebSocket fallback) and ``--runs`` times, a fresh page with a
fake microphone (a WAV) presses Connect and reports, from the page's own clock:

* connect: Connect pressed -> call up (microphone granted; WebRTC: ICE gathered, offer POSTed
  and answered, ICE + DTLS + the data channel open; WebSocket: session.created);
* first audio: Connect pressed -> the server's first agent audio (``output_audio_buffer.started``
  on WebRTC, the first ``response.output_audio.delta`` on the WebSocket);
* round trip and jitter from ``getStats()`` after ``--settle`` seconds (WebRTC only).

The browser runs on the same machine as the server: on a small machine they share the cores.

    .venv/bin/python benchmarks/bench_browser.py --runs 5 --engine loopback
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import wave
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import numpy as np
from playwright.async_api import Browser, async_playwright
from server_process import ServerProcess  # benchmarks/ is on sys.path: scripts run from there

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
TIMEOUT_S = 30.0


@dataclass
class Run:
    transport: str
    connect_ms: float
    first_audio_ms: float | None
    rtt_ms: float | None
    jitter_ms: float | None


def fake_microphone(path: Path) -> Path:
    t = np.arange(48000 * 3) / 48000
    signal = 0.4 * np.sin(2 * np.pi * 220 * t) * (0.55 + 0.45 * np.sin(2 * np.pi * 3 * t))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(48000)
        out.writeframes((signal * 32767).astype(np.int16).tobytes())
    return path


async def one_call(browser: Browser, base: str, transport: str, settle_s: float) -> Run:
    context = await browser.new_context()
    try:
        page = await context.new_page()
        await page.goto(base + "/")
        await page.select_option("select[name=transport]", transport)
        await page.uncheck("input[name=echo_cancellation]")
        await page.click("#connect")
        # Polled (page.wait_for_function evaluates strings, which the page's CSP forbids).
        for _ in range(int(TIMEOUT_S * 20)):
            if await page.evaluate("rtservePage.state === 'connected' && rtservePage.firstAudioMs !== null"):
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(
                f"{transport}: no call within {TIMEOUT_S} s: "
                f"{await page.evaluate('JSON.stringify(rtservePage.notice)')}"
            )
        await asyncio.sleep(settle_s)
        got = await page.evaluate("({c: rtservePage.connectMs, a: rtservePage.firstAudioMs, s: rtservePage.stats})")
        await page.click("#hangup")
        stats = got["s"] or {}
        return Run(transport, got["c"], got["a"], stats.get("rttMs"), stats.get("jitterMs"))
    finally:
        await context.close()


async def run_all(base: str, wav: Path, transports: list[str], runs: int, settle_s: float) -> list[Run]:
    flags = [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--allow-loopback-in-peer-connection",
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        "--autoplay-policy=no-user-gesture-required",
    ]
    results = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=flags)
        try:
            for transport in transports:
                for _ in range(runs):
                    results.append(await one_call(browser, base, transport, settle_s))
        finally:
            await browser.close()
    return results


def summary(runs: list[Run]) -> dict[str, dict[str, float | None]]:
    def p50(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    out = {}
    for transport in dict.fromkeys(r.transport for r in runs):
        mine = [r for r in runs if r.transport == transport]
        out[transport] = {
            "runs": len(mine),
            "connect_p50_ms": p50([r.connect_ms for r in mine]),
            "connect_max_ms": max(r.connect_ms for r in mine),
            "first_audio_p50_ms": p50([r.first_audio_ms for r in mine]),
            "rtt_p50_ms": p50([r.rtt_ms for r in mine]),
            "jitter_p50_ms": p50([r.jitter_ms for r in mine]),
        }
    return out


def print_table(table: dict[str, dict[str, float | None]]) -> None:
    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    print(
        f"{'transport':<10} {'runs':>4} {'connect p50':>12} {'connect max':>12} {'1st audio p50':>14} "
        f"{'rtt p50':>8} {'jitter p50':>11}   (ms)"
    )
    for transport, row in table.items():
        print(
            f"{transport:<10} {row['runs']:>4} {cell(row['connect_p50_ms']):>12} {cell(row['connect_max_ms']):>12} "
            f"{cell(row['first_audio_p50_ms']):>14} {cell(row['rtt_p50_ms']):>8} {cell(row['jitter_p50_ms']):>11}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="calls per transport")
    parser.add_argument("--engine", default="loopback", help="session engine of the server")
    parser.add_argument("--transports", nargs="+", default=["webrtc", "websocket"], choices=["webrtc", "websocket"])
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of call before reading getStats")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_browser.json"))
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is absent: apt-get install chromium", file=sys.stderr)
        return 2
    server = ServerProcess({"RTSERVE_WEBRTC__HOST_ADDRESSES": "[127.0.0.1]"}, engine=args.engine, name="bench_browser")
    try:

        async def ready() -> None:
            async with aiohttp.ClientSession() as http:
                await server.wait_ready(http)

        asyncio.run(ready())
        with tempfile.TemporaryDirectory() as tmp:
            runs = asyncio.run(
                run_all(server.base, fake_microphone(Path(tmp) / "mic.wav"), args.transports, args.runs, args.settle)
            )
    finally:
        server.stop()
    table = summary(runs)
    print_table(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "bench_browser",
                "engine": args.engine,
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "summary": table,
                "runs": [asdict(r) for r in runs],
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
