"""Streaming-text speech and sleep mode on the embedded cascade, over a real socket.

Starts ``rtserve serve`` (cascade, ``--enable-sleep-mode``) in a child process and measures:

* ``WS /v1/audio/speech/stream``: text sent as word deltas at ``--words-per-s`` (an LLM's
  pace); time from the delta that completes the first sentence to its first audio byte,
  and from ``input.done`` to ``session.done``; against ``POST /v1/audio/speech`` with the
  whole text (time to first byte, counted from when the whole text existed);
* ``POST /v1/omni/sleep`` (level 1, every stage) and ``/v1/omni/wakeup``: the bytes the
  server reports, the server process's RSS seen from outside, and how long each call takes.

Medians of ``--runs`` runs. Prints a table; writes JSON to ``--out``.
Run: ``.venv/bin/python benchmarks/bench_speech_stream.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TypedDict

import aiohttp
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_process import ROOT, ServerProcess

TEXT = (
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks "
    "were striking thirteen. Call me Ishmael."
)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def stream_once(base: str, words_per_s: float) -> dict[str, float]:
    url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
    words = TEXT.split(" ")
    first_sentence_end = next(i for i, w in enumerate(words) if w.endswith("."))
    async with websockets.connect(url, max_size=None) as ws:
        sent_first_sentence = done_sent = first_audio = finished = 0.0

        async def feed() -> None:
            nonlocal sent_first_sentence, done_sent
            for i, word in enumerate(words):
                await ws.send(json.dumps({"type": "input.text", "text": word + " "}))
                if i == first_sentence_end:
                    sent_first_sentence = time.perf_counter()
                await asyncio.sleep(1 / words_per_s)
            await ws.send(json.dumps({"type": "input.done"}))
            done_sent = time.perf_counter()

        feeding = asyncio.create_task(feed())
        audio = 0
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                audio += len(message)
                first_audio = first_audio or time.perf_counter()
            elif json.loads(message)["type"] == "session.done":
                finished = time.perf_counter()
                break
        await feeding
    return {
        "first_audio_after_sentence_s": first_audio - sent_first_sentence,
        "done_after_input_done_s": finished - done_sent,
        "audio_s": audio / 2 / 24000,
    }


async def http_once(http: aiohttp.ClientSession, base: str) -> float:
    started = time.perf_counter()
    async with http.post(f"{base}/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}) as resp:
        await resp.content.readany()
        first = time.perf_counter() - started
        await resp.read()
    return first


async def sleep_cycle(http: aiohttp.ClientSession, base: str, pid: int) -> dict[str, float]:
    before = rss_bytes(pid)
    started = time.perf_counter()
    async with http.post(f"{base}/v1/omni/sleep", json={"level": 1}) as resp:
        slept = await resp.json()
    sleep_s = time.perf_counter() - started
    asleep = rss_bytes(pid)
    started = time.perf_counter()
    async with http.post(f"{base}/v1/omni/wakeup", json={}) as resp:
        woke = await resp.json()
    wake_s = time.perf_counter() - started
    return {
        "reported_freed_mb": slept["freed_bytes"] / 2**20,
        "reported_restored_mb": woke["restored_bytes"] / 2**20,
        "rss_before_mb": before / 2**20,
        "rss_asleep_mb": asleep / 2**20,
        "rss_awake_mb": rss_bytes(pid) / 2**20,
        "sleep_s": sleep_s,
        "wake_s": wake_s,
        **{f"freed_{a['stage']}_mb": a["freed_bytes"] / 2**20 for a in slept["acks"]},
    }


class Result(TypedDict):
    """What ``--out`` holds (and the table prints)."""

    machine: str
    runs: int
    words_per_s: float
    stream: dict[str, float]
    http_first_byte_s: float
    sleep: dict[str, float]


async def run(args: argparse.Namespace) -> Result:
    server = ServerProcess({"RTSERVE_ENABLE_SLEEP_MODE": "true"}, engine="cascade", name="speech_stream")
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_ready(http, timeout_s=600)
            await stream_once(server.base, 1000)  # warm-up
            streams = [await stream_once(server.base, args.words_per_s) for _ in range(args.runs)]
            https = [await http_once(http, server.base) for _ in range(args.runs)]
            cycles = [await sleep_cycle(http, server.base, server.proc.pid) for _ in range(args.runs)]
    finally:
        server.stop()
    median = {key: statistics.median(s[key] for s in streams) for key in streams[0]}
    sleep = {key: statistics.median(c[key] for c in cycles) for key in cycles[0]}
    return {
        "machine": platform.processor() or platform.machine(),
        "runs": args.runs,
        "words_per_s": args.words_per_s,
        "stream": median,
        "http_first_byte_s": statistics.median(https),
        "sleep": sleep,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--words-per-s", type=float, default=12.0, help="pace of the text deltas")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_speech_stream.json"))
    args = parser.parse_args()
    result = asyncio.run(run(args))
    stream, sleep = result["stream"], result["sleep"]
    print(f"{'measure':<52} {'median':>10}")
    for label, value in [
        ("stream: first audio after the first sentence (s)", stream["first_audio_after_sentence_s"]),
        ("stream: session.done after input.done (s)", stream["done_after_input_done_s"]),
        ("stream: audio (s)", stream["audio_s"]),
        ("POST /v1/audio/speech: first byte, whole text (s)", result["http_first_byte_s"]),
        *((f"sleep: {key}", value) for key, value in sleep.items()),
    ]:
        print(f"{label:<52} {value:>10.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
