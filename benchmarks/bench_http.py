"""HTTP generation routes on the embedded cascade models, measured over a real socket.

Starts ``rtserve serve`` (default engine: cascade) as a separate process on 127.0.0.1,
waits for ``/health``, warms each route once, then measures with a raw aiohttp client:

* speech (``/v1/audio/speech``, streamed ``pcm``): time to first audio byte, and real-time
  factor = wall time of the whole response / duration of the audio it holds;
* transcription (``/v1/audio/transcriptions``, a WAV made by the speech route): real-time
  factor = response time / audio duration;
* chat (``/v1/chat/completions``, streamed, ``max_tokens`` CHAT_TOKENS): completion
  tokens/s at 1 and 8 concurrent requests, aggregate (all tokens / wall time) and per
  request, plus time to first token (median and p95) and the model calls per round (CTranslate2
  batches, more than one means restarts; approximate, since a reply's last token can reach the
  client before its batch is counted), once per LLM setup in CHAT_SETUPS
  (transformers = before; CTranslate2 with session 24's settings; CTranslate2 now with one
  decode lane; as configured now),
  each on its own server started one after the other in this run; speech and transcription on
  the default.

Medians of RUNS runs (chat: of RUNS rounds). Results go to benchmarks/results/bench_http.json.
Run: ``.venv/bin/python benchmarks/bench_http.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from server_process import free_port, server_env

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bench_http.json"
RUNS = 3
CHAT_TOKENS = 64
CONCURRENCY = (1, 8)
STARTUP_TIMEOUT_S = 600.0
SPEECH_RATE = 24000  # pcm responses are s16le at 24 kHz
SPEECH_TEXT = (
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, "
    "and the clocks were striking thirteen."
)
# (label, environment of its server): the LLM setups whose chat figures are compared side by side.
CHAT_SETUPS = [
    ("transformers", {"RTSERVE_CASCADE__LLM_RUNTIME": "transformers"}),
    (
        "ctranslate2 as in session 24 (2 threads, full-vocabulary top_p, no kept openings, no gathering, one lane)",
        {
            "RTSERVE_CASCADE__LLM_RUNTIME": "ctranslate2",
            "RTSERVE_CASCADE__LLM_THREADS": "2",
            "RTSERVE_CASCADE__LLM_TOP_K": "0",
            "RTSERVE_CASCADE__LLM_CACHED_OPENINGS": "0",
            "RTSERVE_CASCADE__LLM_GATHER_MS": "0",
            "RTSERVE_CASCADE__LLM_LANES": "1",
        },
    ),
    ("ctranslate2, one lane", {"RTSERVE_CASCADE__LLM_RUNTIME": "ctranslate2", "RTSERVE_CASCADE__LLM_LANES": "1"}),
    ("ctranslate2", {"RTSERVE_CASCADE__LLM_RUNTIME": "ctranslate2"}),  # the defaults: measured last, with speech
]
BATCH_CALLS = 'rtserve_cascade_model_call_seconds_count{stage="llm_batch"}'
CHAT_PROMPTS = [
    "Tell me a short story about a robot who learns to paint.",
    "Explain why the sky is blue to a child.",
    "Write a few sentences about the ocean at night.",
    "Describe a busy market in the morning.",
]


async def wait_healthy(http: aiohttp.ClientSession, base: str, server: subprocess.Popen[bytes]) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < STARTUP_TIMEOUT_S:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode} while starting")
        try:
            async with http.get(f"{base}/health") as resp:
                if resp.status == 200:
                    return time.perf_counter() - started
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.5)
    raise SystemExit(f"the server was not healthy after {STARTUP_TIMEOUT_S:.0f} s")


async def speech_once(
    http: aiohttp.ClientSession, base: str, response_format: str = "pcm"
) -> tuple[float, float, bytes]:
    """(seconds to first body byte, seconds for the whole body, body)."""
    started = time.perf_counter()
    async with http.post(
        f"{base}/v1/audio/speech", json={"input": SPEECH_TEXT, "response_format": response_format}
    ) as resp:
        resp.raise_for_status()
        first = await resp.content.readany()
        ttfb = time.perf_counter() - started
        body = first + await resp.read()
    return ttfb, time.perf_counter() - started, body


async def bench_speech(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    ttfbs: list[float] = []
    rtfs: list[float] = []
    audio_s = 0.0
    for _ in range(RUNS):
        ttfb, total, body = await speech_once(http, base)
        audio_s = len(body) / 2 / SPEECH_RATE
        ttfbs.append(ttfb)
        rtfs.append(total / audio_s)
    return {
        "ttfb_ms": 1000 * statistics.median(ttfbs),
        "rtf": statistics.median(rtfs),
        "audio_s": audio_s,
        "ttfb_ms_runs": [round(1000 * t, 1) for t in ttfbs],
        "rtf_runs": [round(r, 3) for r in rtfs],
    }


async def bench_transcription(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    _, _, wav = await speech_once(http, base, "wav")
    audio_s = (len(wav) - 44) / 2 / SPEECH_RATE
    rtfs: list[float] = []
    text = ""
    for _ in range(RUNS):
        form = aiohttp.FormData()
        form.add_field("file", wav, filename="speech.wav", content_type="audio/wav")
        started = time.perf_counter()
        async with http.post(f"{base}/v1/audio/transcriptions", data=form) as resp:
            resp.raise_for_status()
            text = (await resp.json())["text"]
        rtfs.append((time.perf_counter() - started) / audio_s)
    return {"rtf": statistics.median(rtfs), "audio_s": audio_s, "text": text, "rtf_runs": [round(r, 3) for r in rtfs]}


async def chat_once(http: aiohttp.ClientSession, base: str, prompt: str) -> tuple[float, float, int]:
    """(seconds to first content, seconds in all, completion tokens) of one streamed chat, at the
    default sampling and without a seed, as chat clients send them."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": CHAT_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft, tokens = None, 0
    async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if ttft is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    total = time.perf_counter() - started
    return (ttft if ttft is not None else total), total, tokens


async def model_calls(http: aiohttp.ClientSession, base: str) -> float:
    """CTranslate2 ``generate_batch`` calls so far (0 on transformers), from ``/metrics``."""
    async with http.get(f"{base}/metrics") as resp:
        resp.raise_for_status()
        for line in (await resp.text()).splitlines():
            if line.startswith(BATCH_CALLS):
                return float(line.split()[-1])
    return 0.0


async def bench_chat(http: aiohttp.ClientSession, base: str, concurrency: int) -> dict[str, Any]:
    aggregate: list[float] = []
    per_request: list[float] = []
    ttfts: list[float] = []
    calls_before = await model_calls(http, base)
    for _ in range(RUNS):
        started = time.perf_counter()
        results = await asyncio.gather(
            *(chat_once(http, base, CHAT_PROMPTS[i % len(CHAT_PROMPTS)]) for i in range(concurrency))
        )
        wall = time.perf_counter() - started
        aggregate.append(sum(tokens for _, _, tokens in results) / wall)
        per_request.extend(tokens / total for _, total, tokens in results)
        ttfts.extend(ttft for ttft, _, _ in results)
    return {
        "concurrency": concurrency,
        "aggregate_tokens_per_s": statistics.median(aggregate),
        "per_request_tokens_per_s": statistics.median(per_request),
        "ttft_ms": 1000 * statistics.median(ttfts),
        "ttft_p95_ms": 1000 * statistics.quantiles(ttfts, n=20, method="inclusive")[-1],
        "model_calls_per_round": (await model_calls(http, base) - calls_before) / RUNS,
    }


async def serve(setup: dict[str, str], measure: bool) -> dict[str, Any]:
    """Start a server with the environment ``setup``; chat figures (and, with ``measure``, speech
    and transcription)."""
    port = free_port()
    env = server_env({"RTSERVE_LOG_LEVEL": "warning", **setup})
    command = [sys.executable, "-m", "rtserve.cli", "serve", "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, env=env)  # noqa: ASYNC220 - starts the server, never waits on it
    base = f"http://127.0.0.1:{port}"
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            load_s = await wait_healthy(http, base, server)
            await chat_once(http, base, CHAT_PROMPTS[0])  # first calls pay one-off costs
            found: dict[str, Any] = {"model_load_s": load_s}
            if measure:
                await speech_once(http, base)
                found.update(speech=await bench_speech(http, base), transcription=await bench_transcription(http, base))
            found["chat"] = [await bench_chat(http, base, c) for c in CONCURRENCY]
            return found
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


async def main() -> dict[str, Any]:
    load_before = os.getloadavg()[0]  # other work on the machine skews every number below
    found = {label: await serve(setup, measure=label == CHAT_SETUPS[-1][0]) for label, setup in CHAT_SETUPS}
    after = found[CHAT_SETUPS[-1][0]]
    machine = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
    }
    return {
        "machine": machine,
        "runs": RUNS,
        "model_load_s": after["model_load_s"],
        "speech": after["speech"],
        "transcription": after["transcription"],
        "chat": after["chat"],
        "chat_by_runtime": {label: setup["chat"] for label, setup in found.items()},
    }


def print_table(results: dict[str, Any]) -> None:
    speech, asr = results["speech"], results["transcription"]
    rows = [
        ("speech time to first byte", f"{speech['ttfb_ms']:.0f} ms", f"{speech['audio_s']:.1f} s of audio, pcm"),
        ("speech real-time factor", f"{speech['rtf']:.3f}", "wall / audio duration (lower is faster)"),
        ("transcription real-time factor", f"{asr['rtf']:.3f}", f"{asr['audio_s']:.1f} s WAV upload"),
    ]
    for runtime, chats in results["chat_by_runtime"].items():
        for chat in chats:
            rows.append(
                (
                    f"chat tokens/s @ {chat['concurrency']} concurrent, {runtime}",
                    f"{chat['aggregate_tokens_per_s']:.1f}",
                    f"per request {chat['per_request_tokens_per_s']:.1f} tok/s, first token "
                    f"{chat['ttft_ms']:.0f} ms (p95 {chat['ttft_p95_ms']:.0f} ms), "
                    f"{chat['model_calls_per_round']:.1f} batches/round",
                )
            )
    base = results["chat_by_runtime"]["transformers"]
    for runtime, chats in results["chat_by_runtime"].items():
        single, most = chats[0]["aggregate_tokens_per_s"], chats[-1]["aggregate_tokens_per_s"]
        rows.append(
            (
                f"chat batching gain, {runtime}",
                f"{most / single:.2f}x",
                f"{chats[-1]['concurrency']} concurrent aggregate / 1 request; vs transformers: 1 request "
                f"{single / base[0]['aggregate_tokens_per_s']:.2f}x, {chats[-1]['concurrency']} concurrent "
                f"{most / base[-1]['aggregate_tokens_per_s']:.2f}x",
            )
        )
    width = max(len(r[0]) for r in rows)
    machine = results["machine"]
    print(
        f"\nHTTP routes, cascade engine, medians of {results['runs']} runs ({machine['cpus']} CPUs, "
        f"1-min load {machine['load_average_1m']['before']:.1f} before / "
        f"{machine['load_average_1m']['after']:.1f} after; models loaded in {results['model_load_s']:.1f} s)"
    )
    print(f"{'metric':<{width}}  {'median':>10}  notes")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>10}  {note}")
    print(f"transcript: {asr['text']!r}")


if __name__ == "__main__":
    outcome = asyncio.run(main())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(outcome, indent=2))
    print_table(outcome)
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
