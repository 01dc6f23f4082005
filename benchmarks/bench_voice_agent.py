"""The GPU voice agent of issue 34: the realtime cascade hearing with the Kyutai STT engine
(``cascade.asr: stt_engine``) and speaking with the Kyutai TTS engine (``cascade.tts:
tts_engine``), both on random weights of their published shapes, N paced speech clients on
``WS /v1/realtime`` in several processes, one ``rtserve serve --engine cascade`` child per N.

The LLM is ``paced_llm.py``, a BENCHMARK STAND-IN reached as ``cascade.llm_engine: vllm``: it
answers ``--llm-reply-words`` random words (8-12), the first after ``--llm-first-token-ms``, then
``--llm-tokens-per-s`` per reply, for any number of replies at once, and uses no GPU: the figures are
the STT and TTS engines and the server under an LLM of that speed. ``--llm in-process`` instead runs
the cascade's continuously batched transformers runtime in the agent's engine process
(``cascade.llm_runtime: transformers_batched``) on the STT's device: on a GPU, random weights of
``--llm-shape`` (``random_llm.py``: Llama 3.2 1B's or SmolLM2-1.7B's) stepped as CUDA graphs
(``llm_cuda_graphs``), its replies
capped by the sessions' ``max_output_tokens`` (``--llm-max-tokens``); vLLM, the other batched GPU
LLM, is not installed on the H200 host. ``--llm server`` runs that same model in an rtserve of its
own (``--engine loopback``, ``http.text_engine: embedded``; ``--llm-server-workers`` front-ends, its
own engine process and CUDA context) that the agent
reaches as its vLLM (``cascade.llm_engine: vllm``; ``/tokenize`` and ``max_model_len``,
docs/serving.md#tokenize): the STT's engine process then steps the STT alone.

Clients are live microphones at real time: 40 ms chunks of PCM16, silence except for one spoken
question (the shipped Piper voice, read in this process as the voice-agent test does: the random
Kyutai TTS behind the server's own ``/v1/audio/speech`` need not sound like speech to the VAD)
every ``--period`` seconds, at phases spread over the period. The turn ends by server VAD (Silero
on the audio, ``--silence-ms``), or with ``--client-commit`` where the client's question ends (it
commits and sends ``response.create``; the STT's delay is then flushed, not waited out): the
random STT's end-of-turn head means nothing, and its
transcript may be empty (counted), which still starts the reply (``create_response`` at the
commit; ``sessions/turns.py`` starts it once the transcript resolves, whatever its text), so the
client never sends ``response.create``. Per turn, from the
send time of the chunk holding the question's last voiced sample ("end of speech"):

* first reply audio (the first ``response.output_audio.delta`` of the turn's response) p50/p95,
  split into VAD (-> ``speech_stopped``), STT (-> the final transcript, the model's delay) and
  reply (transcript -> first audio: LLM first token + TTS first audio);
* underruns once audio starts: a delta arriving after everything before it would have played out
  at real time (``bench_kyutai_served.stalls``), count and ms;
* turns without a reply, replies cut short (``response.done`` not ``completed``), error events;
* server CPU (all processes, busiest), the GPU's busy share (``gpu_busy``), the STT and TTS
  engines' tick p99 from ``/metrics``, and the GPU memory each server's torch holds at the end
  (``rtserve_torch_cuda_memory_bytes``: reserved, what another model on the card would not find,
  and of it what is in tensors; the rest is the caching allocator's free blocks).

``--mps`` runs the whole point under NVIDIA's Multi-Process Service (``cuda_mps.py``), so the two
servers' CUDA contexts run kernels side by side instead of in turns; the agent's server is then a
client of below-normal priority (``--mps-agent-priority``, the README's layout): where both have
kernels waiting, the TTS server's go first, and a new reply's steps to its first audio no longer
queue behind the STT's batch (benchmarks/notes/voice_agent_gpu.md, "Twenty-fifth session").

``--tts-server-workers W`` runs the TTS engine in a server of its own (``rtserve serve`` with W
workers, its engine process holding the TTS alone) that the voice agent speaks through
(``cascade.tts: tts_server``): the same GPU, the STT and the TTS in two interpreters and CUDA
contexts instead of one engine process. CPU and metrics are of both servers.

    .venv/bin/python benchmarks/bench_voice_agent.py --shape tiny --clients 2 --duration 22 --warmup 1 --period 12
    python3 benchmarks/bench_voice_agent.py --shape real --clients 256 --client-procs 8 --kit KIT  # H200:
    # benchmarks/notes/voice_agent_gpu.md (a host without the embedded CPU models: voice_agent_kit.py)

Prints a table; JSON to ``benchmarks/results/bench_voice_agent.json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import wave
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import cuda_mps
import gpu_busy
import numpy as np
import numpy.typing as npt
import pyspy
import voice_agent_kit
from bench_kyutai_served import (  # benchmarks/ on sys.path
    GPU_MEMORY,
    VOICE,
    Reply,
    first_audio_steps,
    ready_probe,
    stalls,
    write_stt_weights,
    write_tts_weights,
)
from load_shards import ShardResult, gather_shards, merge_logs, run_shard, split
from random_llm import SHAPES as LLM_SHAPES
from random_llm import shipped_tokenizer, write_random_llm
from server_process import ServerProcess, free_port, histogram_mean, histogram_quantile, scrape, tick_parts_p99_ms

Pcm16 = npt.NDArray[np.int16]  # the question's samples, as the client sends them
# start_at, period, stop_at, server VAD silence_ms (None: client commits), the sessions' max_output_tokens
ClientArgs = tuple[float, float, float, int | None, int | None]
ROOT = Path(__file__).resolve().parents[1]
KINDS = ("allocated", "reserved")
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first

RATE = 24_000
CHUNK = 960  # 40 ms
CHUNK_S = CHUNK / RATE
QUESTION = "What is the capital of France?"
SHAPES = {"tiny": ("tiny", "tiny"), "real": ("stt-1b", "tts-1.6b")}  # (STT, TTS) of bench_kyutai_served
REPLY_ROOM_S = 5.0  # a turn counts when its speech ended this long before the clients stopped
VOICED = 0.02  # |sample| above this is speech (float scale), as bench_cascade's last_voiced


@dataclass
class Turn:
    speech_end: float  # send time of the chunk holding the question's last voiced sample
    stopped: float = 0.0
    transcript: float = 0.0
    heard: str | None = None  # the final transcript
    response_id: str | None = None
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples) of its reply
    status: str | None = None


@dataclass
class ClientLog:
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)


def chunk_message(pcm: Pcm16) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm.tobytes()).decode()})


def on_event(event: dict[str, Any], log: ClientLog, now: float) -> None:
    """Note ``event`` on the turn it belongs to (the latest question's)."""
    kind = event["type"]
    if kind == "error":
        error = event["error"]
        log.errors.append(f"{error.get('code') or 'error'}: {error.get('message', '')}"[:120])
    if not log.turns:
        return
    turn = log.turns[-1]
    if kind == "input_audio_buffer.speech_stopped":
        turn.stopped = turn.stopped or now
    elif kind == "conversation.item.input_audio_transcription.completed":
        if not turn.transcript:
            turn.transcript, turn.heard = now, event["transcript"]
    elif kind == "response.created" and turn.response_id is None:
        turn.response_id = event["response"]["id"]
    elif kind == "response.output_audio.delta" and event.get("response_id") == turn.response_id:
        turn.audio.append((now, len(base64.b64decode(event["delta"])) // 2))
    elif kind == "response.done" and event["response"]["id"] == turn.response_id:
        turn.status = event["response"]["status"]


async def client(
    http: aiohttp.ClientSession,
    url: str,
    question: Pcm16,
    phase: float,
    args: ClientArgs,
    log: ClientLog,
) -> None:
    """One live microphone from ``start_at``: silence, and the question every ``period`` s from
    ``phase`` on. ``silence_ms`` None: no server VAD; the client commits and asks for the reply
    right after the question's last voiced chunk (its own end-of-turn detection, or push-to-talk).
    ``max_output_tokens``: the session's reply cap (None: the server's)."""
    start_at, period, stop_at, silence_ms, max_output_tokens = args
    loop = asyncio.get_running_loop()
    silence = chunk_message(np.zeros(CHUNK, np.int16))
    spoken = [chunk_message(question[i : i + CHUNK]) for i in range(0, len(question), CHUNK)]
    last_voiced_chunk = int(np.flatnonzero(np.abs(question) > VOICED * 32768)[-1]) // CHUNK
    try:
        async with http.ws_connect(url, max_msg_size=0) as ws:
            created = json.loads((await ws.receive(timeout=60)).data)
            if created.get("type") != "session.created":
                raise RuntimeError(f"no session: {str(created)[:100]}")
            detection = None if silence_ms is None else {"type": "server_vad", "silence_duration_ms": silence_ms}
            session: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
            if max_output_tokens is not None:
                session["max_output_tokens"] = max_output_tokens
            await ws.send_json({"type": "session.update", "session": session})

            async def receive() -> None:
                async for message in ws:
                    if message.type is aiohttp.WSMsgType.TEXT:
                        on_event(json.loads(message.data), log, loop.time())

            receiver = asyncio.create_task(receive())
            start = phase - int((phase - start_at) / CHUNK_S) * CHUNK_S  # the chunk grid through ``phase``
            k, asked = 0, -1
            while (due := start + k * CHUNK_S) < stop_at:
                await asyncio.sleep(max(0.0, due - loop.time()))
                log.send_lag_ms.append((loop.time() - due) * 1e3)
                offset = due - phase
                question_no, at = divmod(round(offset / CHUNK_S), round(period / CHUNK_S)) if offset >= 0 else (-1, 0)
                if question_no >= 0 and at < len(spoken):
                    await ws.send_str(spoken[at])
                    if question_no != asked and at == last_voiced_chunk:
                        asked = question_no
                        log.turns.append(Turn(speech_end=loop.time()))
                        if silence_ms is None:  # the turn ends here: the "VAD" part is nil
                            log.turns[-1].stopped = loop.time()
                            await ws.send_json({"type": "input_audio_buffer.commit"})
                            await ws.send_json({"type": "response.create"})
                else:
                    await ws.send_str(silence)
                k += 1
            await asyncio.sleep(2.0)  # the last replies' tails
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    except Exception as exc:  # noqa: BLE001 - a failed client is counted, not fatal to the run
        log.errors.append(f"{type(exc).__name__}: {exc}"[:120])


async def run_clients(url: str, question: Pcm16, phases: list[float], args: ClientArgs) -> list[ClientLog]:
    logs = [ClientLog() for _ in phases]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(client(http, url, question, p, args, log) for p, log in zip(phases, logs)))
    return logs


def shard(
    url: str,
    question: Pcm16,
    phases: list[float],
    args: ClientArgs,
    window: tuple[float, float],
) -> ShardResult[ClientLog]:
    return run_shard(lambda: run_clients(url, question, phases, args), window)


def spoken_question(path: Path) -> Pcm16:
    """``QUESTION`` in the shipped Piper voice, 24 kHz PCM16, with 0.3 s of silence before; kept
    as a WAV at ``path`` (a host without Piper, such as the H200 host, is given that file)."""
    if not path.exists():
        from tests.web.realtime.test_realtime_gpu_agent_cpu import piper_pcm

        pcm = np.concatenate([np.zeros(RATE * 3 // 10, np.int16), piper_pcm(QUESTION)])
        path.parent.mkdir(parents=True, exist_ok=True)
        with wave.open(str(path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(RATE)
            out.writeframes(pcm.tobytes())
    with wave.open(str(path), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, RATE), f"{path}: not 24 kHz PCM16"
        return np.frombuffer(wav.readframes(wav.getnframes()), np.int16)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def tts_env(args: argparse.Namespace, clients: int) -> dict[str, str]:
    """The Kyutai TTS engine's settings, for whichever server runs it."""
    device, dtype = ("cuda", "bfloat16") if args.cuda else ("cpu", "float32")
    return {
        "RTSERVE_TTS_ENGINE__WEIGHTS": str(args.tts_folder),
        "RTSERVE_TTS_ENGINE__VOICES": str(args.voices),
        "RTSERVE_TTS_ENGINE__DEFAULT_VOICE": VOICE,
        "RTSERVE_TTS_ENGINE__DEVICE": device,
        "RTSERVE_TTS_ENGINE__DTYPE": dtype,
        "RTSERVE_TTS_ENGINE__MAX_SESSIONS": str(clients),
    }


def torch_threads(args: argparse.Namespace) -> dict[str, str]:
    """A server's torch intra-op threads (``--server-threads``; default: torch's own)."""
    return {"OMP_NUM_THREADS": str(args.server_threads)} if args.server_threads else {}


def server_env(args: argparse.Namespace, clients: int, llm: dict[str, str], tts_server: str | None) -> dict[str, str]:
    """The voice agent's settings; ``llm``: its LLM's (``llm_env``); ``tts_server``: the URL of
    the TTS server it speaks through (None: its own engine process runs the TTS)."""
    device, dtype = ("cuda", "bfloat16") if args.cuda else ("cpu", "float32")
    speech = (
        {"RTSERVE_CASCADE__TTS": "tts_server", "RTSERVE_CASCADE__TTS_SERVER__URL": tts_server}
        if tts_server
        else {"RTSERVE_CASCADE__TTS": "tts_engine", **tts_env(args, clients)}
    )
    return {
        "RTSERVE_CASCADE__ASR": "stt_engine",
        **llm,
        "RTSERVE_STT_ENGINE__WEIGHTS": str(args.stt_folder),
        "RTSERVE_STT_ENGINE__DEVICE": device,
        "RTSERVE_STT_ENGINE__DTYPE": dtype,
        "RTSERVE_STT_ENGINE__BATCH_SIZE": str(clients),
        "RTSERVE_SESSIONS__MAX_SESSIONS": str(clients),
        **speech,
        **torch_threads(args),
        **(voice_agent_kit.env(args.kit) if args.kit else {}),
        **(cuda_mps.client_priority_env(args.mps_agent_priority) if args.mps else {}),
        **dict(setting.split("=", 1) for setting in args.set),
    }


def vllm_env(url: str, model: str) -> dict[str, str]:
    """The agent's LLM at ``url``, spoken to as a vLLM (the stand-in, or an rtserve's own LLM)."""
    return {"RTSERVE_CASCADE__LLM_ENGINE": "vllm", "RTSERVE_HTTP__VLLM__URL": url, "RTSERVE_HTTP__VLLM__MODEL": model}


def llm_env(args: argparse.Namespace) -> dict[str, str]:
    """The embedded LLM's settings (``--llm in-process`` in the agent, ``--llm server`` in a server
    of its own): continuous batching on the GPU, ``args.llm_folder`` or the shipped model."""
    device, dtype = ("cuda", "bfloat16") if args.cuda else ("cpu", "float32")
    return {
        "RTSERVE_CASCADE__LLM_ENGINE": "embedded",
        "RTSERVE_CASCADE__LLM_RUNTIME": "transformers_batched",
        "RTSERVE_CASCADE__LLM_DEVICE": device,
        "RTSERVE_CASCADE__LLM_DTYPE": dtype,
        # Eager, its steps are host-bound: 6x slower to the first token on an H200
        # (benchmarks/notes/voice_agent_gpu.md).
        "RTSERVE_CASCADE__LLM_CUDA_GRAPHS": str(args.cuda).lower(),
        "RTSERVE_CASCADE__LLM_MAX_ACTIVE": str(args.llm_max_active),
        # A voice turn's prompt and reply are a few hundred tokens: 512 a reply, not the 2048 context each.
        "RTSERVE_CASCADE__LLM_KV_TOKENS": str(args.llm_max_active * 512),
        **({"RTSERVE_MODELS__LLM": str(args.llm_folder)} if args.llm_folder else {}),
    }


def start_llm(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    """The LLM stand-in (``paced_llm.py``) on ``port``."""
    pace = ["--first-token-ms", str(args.llm_first_token_ms), "--tokens-per-s", str(args.llm_tokens_per_s)]
    pace += ["--reply-words", *map(str, args.llm_reply_words)]
    return subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "paced_llm.py"), "--port", str(port), *pace])


def start_llm_server(args: argparse.Namespace, clients: int) -> ServerProcess:
    """``--llm server``: the embedded LLM in an rtserve of its own. Each reply asks it twice
    (``/tokenize``, then the chat completion), one after the other: a slot per session."""
    env = {
        **llm_env(args),
        "RTSERVE_HTTP__TEXT_ENGINE": "embedded",  # the LLM alone, beside the loopback engine: an LLM server
        "RTSERVE_TRANSPORT__MAX_CONCURRENT_HTTP_GENERATIONS": str(2 * clients),
        **torch_threads(args),
    }
    return ServerProcess(env, engine="loopback", name="bench_voice_agent_llm", workers=args.llm_server_workers)


async def served_llm(http: aiohttp.ClientSession, base: str) -> str:
    """The model id a ready server lists with its context (``max_model_len``): its LLM's."""
    async with http.get(f"{base}/v1/models") as resp:
        models = (await resp.json())["data"]
    [model] = [m["id"] for m in models if m.get("max_model_len")]
    return str(model)


async def run_point(args: argparse.Namespace, clients: int, question: Pcm16) -> dict[str, Any]:
    llm_port = free_port()
    stand_in = start_llm(args, llm_port) if args.llm == "stand-in" else None
    llm_server = start_llm_server(args, clients) if args.llm == "server" else None
    tts = None
    if args.tts_server_workers:
        tts_settings = dict(setting.split("=", 1) for setting in args.tts_set)
        env = {**tts_env(args, clients), **torch_threads(args), **tts_settings}
        tts = ServerProcess(env, name="bench_voice_agent_tts", workers=args.tts_server_workers)
    tts_url = None if tts is None else tts.base.replace("http", "ws") + "/api/tts_streaming"
    servers = [each for each in (tts, llm_server) if each is not None]  # the agent goes first once started

    def cpu() -> dict[int, float]:
        return {pid: seconds for each in servers for pid, seconds in each.cpu_by_process().items()}

    async def metrics(http: aiohttp.ClientSession) -> dict[str, float]:
        """The Kyutai engines' series, of the agent and the TTS server (the LLM server has none)."""
        speech = [each for each in servers if each is not llm_server]
        return {key: value for each in speech for key, value in (await scrape(http, each.base)).items()}

    started = time.monotonic()
    ready_s: dict[str, float] = {}

    async def ready(each: ServerProcess, http: aiohttp.ClientSession, probe: Any = None) -> None:
        await each.wait_ready(http, timeout_s=args.ready_timeout, probe=probe)
        ready_s[each.name] = time.monotonic() - started

    try:
        async with aiohttp.ClientSession() as http:
            try:
                if llm_server is not None:  # the agent names its model, which it lists once loaded
                    await ready(llm_server, http)
                    llm = vllm_env(llm_server.base, await served_llm(http, llm_server.base))
                elif stand_in is not None:
                    llm = vllm_env(f"http://127.0.0.1:{llm_port}", "paced-llm-stand-in")
                else:
                    llm = llm_env(args)
                # The agent loads while the TTS server does (it opens TTS streams per session, not at start):
                # their CUDA graphs, most of a start, are captured side by side.
                server = ServerProcess(
                    server_env(args, clients, llm, tts_url),
                    engine="cascade",
                    name="bench_voice_agent",
                    workers=args.workers,
                )
                servers.insert(0, server)
                waits = [asyncio.create_task(ready(server, http))]
                if tts is not None:
                    probe = await ready_probe(f"{tts_url}?voice={VOICE}")
                    waits.append(asyncio.create_task(ready(tts, http, probe)))
                try:
                    await asyncio.gather(*waits)
                finally:  # the first failure says why; the other wait ends with it
                    for wait in waits:
                        wait.cancel()
                    await asyncio.gather(*waits, return_exceptions=True)
            except RuntimeError as exc:  # one server's start may have been held up by another's (one GPU)
                states = [
                    f"{each.name}: /health {await each.health_text(http)}\n{await each.log_tail(1500)}"
                    for each in servers
                ]
                raise RuntimeError(f"{exc}\n--- every server of the point:\n" + "\n".join(states)) from None
            url = server.base.replace("http", "ws") + "/v1/realtime"
            start_at = time.monotonic() + 3.0 + 0.01 * clients
            stop_at = start_at + args.duration
            window = (start_at + args.warmup, stop_at)
            ranges = split(clients, args.client_procs)
            # First questions spread over the first period after the warm-up: every client asks in the window.
            phases = [start_at + args.warmup + args.period * i / clients for i in range(clients)]
            reply_cap = None if args.llm == "stand-in" else args.llm_max_tokens
            client_args = (start_at, args.period, stop_at, None if args.client_commit else args.silence_ms, reply_cap)
            jobs = [(url, question, [phases[i] for i in r], client_args, window) for r in ranges]
            shards = asyncio.create_task(gather_shards(shard, jobs))
            await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
            cpu_before, metrics_before = cpu(), await metrics(http)
            measured_s = window[1] - window[0]
            spy, tts_spy = args.profile_engine, args.profile_tts
            profiler = pyspy.start(server.engine_pid(), measured_s, spy) if spy else None
            tts_profiler = pyspy.start(tts.engine_pid(), measured_s, tts_spy) if tts is not None and tts_spy else None
            gpu = gpu_busy.start()
            try:
                await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
            finally:  # the sampler never outlives the window (a child process would)
                gpu_pct = gpu_busy.finish(gpu)
            cpu_after, metrics_after = cpu(), await metrics(http)
            # Per server: GB in tensors and GB taken from the driver (the difference: the caching allocator's
            # free blocks, which a neighbouring process on the GPU cannot use).
            gpu_gb: dict[ServerProcess | None, dict[str, float]] = {None: dict.fromkeys(KINDS, float("nan"))}
            for each in servers:
                found = await scrape(http, each.base)
                gpu_gb[each] = {kind: found.get(GPU_MEMORY.format(kind), float("nan")) / 2**30 for kind in KINDS}
            title = f"engine process, N={clients} workers={args.workers}"
            await asyncio.to_thread(pyspy.report, profiler, spy, title)
            if tts_spy:
                title = f"TTS server's engine process, N={clients} workers={args.tts_server_workers}"
                await asyncio.to_thread(pyspy.report, tts_profiler, tts_spy, title)
            results = await shards
            log_tails = {each.name: await each.log_tail(8000) for each in servers}  # stop() removes the logs
    finally:
        for each in servers:
            each.stop()
        if stand_in is not None:
            stand_in.terminate()
            stand_in.wait(10)
    logs = merge_logs(results, ranges, clients)
    # Turns whose speech ended in the window and whose reply had time to start before the clients stopped.
    turns = [t for log in logs for t in log.turns if window[0] <= t.speech_end <= stop_at - REPLY_ROOM_S]
    answered = [t for t in turns if t.audio]
    first = [(t.audio[0][0] - t.speech_end) * 1e3 for t in answered]
    gaps = [stalls(Reply(0, audio=t.audio)) for t in answered]
    measured_s = window[1] - window[0]
    point: dict[str, Any] = {
        "clients": clients,
        "workers": args.workers,
        "tts_server_workers": args.tts_server_workers,
        "tts_set": args.tts_set,
        "ready_s": ready_s,  # each server's start -> ready, from the point's start
        "turns": len(turns),
        "answered": len(answered),
        "first_audio_p50_ms": _pct(first, 50),
        "first_audio_p95_ms": _pct(first, 95),
        "first_audio_max_ms": max(first, default=float("nan")),
        "vad_p50_ms": _pct([(t.stopped - t.speech_end) * 1e3 for t in answered if t.stopped], 50),
        "stt_p50_ms": _pct([(t.transcript - t.stopped) * 1e3 for t in answered if t.stopped and t.transcript], 50),
        "reply_p50_ms": _pct([(t.audio[0][0] - t.transcript) * 1e3 for t in answered if t.transcript], 50),
        "underrun_replies": sum(count > 0 for count, _ in gaps),
        "underruns": sum(count for count, _ in gaps),
        "underrun_ms": sum(ms for _, ms in gaps),
        "empty_transcripts": sum(t.heard == "" for t in turns),
        "reply_audio_p50_s": _pct([sum(n for _, n in t.audio) / RATE for t in answered], 50),
        "cut_replies": sum(t.status not in (None, "completed") for t in answered),
        "statuses": dict(Counter(str(t.status) for t in answered)),
        "errors": sum(len(log.errors) for log in logs),
        "first_errors": sorted({e for log in logs for e in log.errors})[:5],
        "server_cpu_pct": 100.0 * (sum(cpu_after.values()) - sum(cpu_before.values())) / measured_s,
        "busiest_server_pct": server.busiest_pct(cpu_before, cpu_after, measured_s),
        "gpu_busy_pct": gpu_pct,
        "gpu_gb_engine": gpu_gb[server]["reserved"],
        "gpu_gb_engine_allocated": gpu_gb[server]["allocated"],
        "gpu_gb_tts": gpu_gb[tts]["reserved"],
        "gpu_gb_tts_allocated": gpu_gb[tts]["allocated"],
        "gpu_gb_llm": gpu_gb[llm_server]["reserved"],
        "gpu_gb_llm_allocated": gpu_gb[llm_server]["allocated"],
        "busiest_client_pct": 100.0 * max(r.cpu_s for r in results) / measured_s,
        "send_lag_p99_ms": _pct([v for log in logs for v in log.send_lag_ms], 99),
    }
    if point["errors"]:  # why, in the servers' own words (an engine's failure is logged, not sent)
        point["server_log_tails"] = log_tails
    for engine in ("stt", "tts"):
        seconds = histogram_quantile(metrics_before, metrics_after, f"rtserve_kyutai_{engine}_tick_seconds", 0.99)
        point[f"{engine}_tick_p99_ms"] = seconds * 1e3
        parts = tick_parts_p99_ms(metrics_before, metrics_after, f"rtserve_kyutai_{engine}_")
        point |= {f"{engine}_{name}": value for name, value in parts.items()}
    # Model calls a second: a text-to-speech batch read at playback speed needs ~12.5 (one a
    # frame) plus new replies' steps; stepped for every frame a reader takes, far more.
    calls = "rtserve_kyutai_tts_tick_seconds_count"
    point["tts_calls_per_s"] = (metrics_after.get(calls, 0.0) - metrics_before.get(calls, 0.0)) / measured_s
    # Where the TTS's part goes: a reply's full and pre-audio steps before its first audio, the
    # model's steps by kind, what a step computed on average (docs/engines.md#pre-audio-steps).
    point |= {f"tts_{key}": value for key, value in first_audio_steps(metrics_before, metrics_after).items()}
    for q in (0.5, 0.95):  # the TTS engine's own share of the reply's first audio
        seconds = histogram_quantile(
            metrics_before, metrics_after, "rtserve_kyutai_tts_first_audio_after_text_seconds", q
        )
        point[f"tts_after_text_p{round(q * 100)}_ms"] = seconds * 1e3
    # The LLM's part as the agent saw it (reply request -> first token; tokens a second a reply),
    # whichever LLM answers: interpolated within the histograms' buckets, so near, not exact.
    point["llm_first_token_p50_ms"] = 1e3 * histogram_quantile(
        metrics_before, metrics_after, "rtserve_cascade_turn_seconds", 0.5, 'stage="llm_first_token"'
    )
    point["llm_tokens_per_s_p50"] = histogram_quantile(
        metrics_before, metrics_after, "rtserve_cascade_llm_tokens_per_second", 0.5
    )
    # The STT's drain steps (a turn's flush is paid in them, docs/engines.md#draining-waiting-input):
    # how many a second, the rows each advanced on average, what one cost, and (flush rows) the
    # frames a burst stepped.
    steps, frames = (
        metrics_after.get(name, 0.0) - metrics_before.get(name, 0.0)
        for name in ("rtserve_kyutai_stt_drain_steps_total", "rtserve_kyutai_stt_drained_input_frames_total")
    )
    point["stt_drains_per_s"] = steps / measured_s
    point["stt_drain_rows"] = frames / steps if steps else float("nan")
    point["stt_drain_ms"] = 1e3 * histogram_mean(metrics_before, metrics_after, "rtserve_kyutai_stt_drain_step_seconds")
    point["stt_burst_frames"] = histogram_mean(metrics_before, metrics_after, "rtserve_kyutai_stt_drain_burst_frames")
    return point


COLUMNS = [
    ("N", "clients", "{}"),
    ("workers", "workers", "{}"),
    ("turns", "turns", "{}"),
    ("answered", "answered", "{}"),
    ("1st audio p50", "first_audio_p50_ms", "{:.0f}"),
    ("p95", "first_audio_p95_ms", "{:.0f}"),
    ("max", "first_audio_max_ms", "{:.0f}"),
    ("VAD p50", "vad_p50_ms", "{:.0f}"),
    ("STT p50", "stt_p50_ms", "{:.0f}"),
    ("reply p50", "reply_p50_ms", "{:.0f}"),
    ("underrun replies", "underrun_replies", "{}"),
    ("underrun ms", "underrun_ms", "{:.0f}"),
    ("reply s p50", "reply_audio_p50_s", "{:.1f}"),
    ("cut", "cut_replies", "{}"),
    ("errors", "errors", "{}"),
    ("server CPU %", "server_cpu_pct", "{:.0f}"),
    ("busiest %", "busiest_server_pct", "{:.0f}"),
    ("GPU busy %", "gpu_busy_pct", "{:.0f}"),
    ("GPU GB engine", "gpu_gb_engine", "{:.1f}"),
    ("in tensors", "gpu_gb_engine_allocated", "{:.1f}"),
    ("TTS server", "gpu_gb_tts", "{:.1f}"),
    ("in tensors", "gpu_gb_tts_allocated", "{:.1f}"),
    ("LLM server", "gpu_gb_llm", "{:.1f}"),
    ("in tensors", "gpu_gb_llm_allocated", "{:.1f}"),
    ("STT tick p99", "stt_tick_p99_ms", "{:.1f}"),
    ("STT drains/s", "stt_drains_per_s", "{:.1f}"),
    ("rows/drain", "stt_drain_rows", "{:.1f}"),
    ("drain ms", "stt_drain_ms", "{:.1f}"),
    ("frames/burst", "stt_burst_frames", "{:.1f}"),
    ("TTS tick p99", "tts_tick_p99_ms", "{:.1f}"),
    ("TTS calls/s", "tts_calls_per_s", "{:.1f}"),
    ("TTS step rows", "tts_step_rows", "{:.0f}"),
    ("span", "tts_step_span", "{:.0f}"),
    ("LLM 1st token p50", "llm_first_token_p50_ms", "{:.0f}"),
    ("LLM tok/s p50", "llm_tokens_per_s_p50", "{:.0f}"),
    ("TTS after text p50", "tts_after_text_p50_ms", "{:.0f}"),
    ("p95", "tts_after_text_p95_ms", "{:.0f}"),
    ("TTS 1st full steps p50", "tts_first_full_steps_p50", "{:.1f}"),
    ("pre steps p50", "tts_first_pre_audio_steps_p50", "{:.1f}"),
    ("young full", "tts_young_batch_full", "{:.0f}"),
    ("client %", "busiest_client_pct", "{:.0f}"),
]


def print_table(points: list[dict[str, Any]]) -> None:
    print("| " + " | ".join(name for name, _, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for p in points:
        print("| " + " | ".join(fmt.format(p[key]) for _, key, fmt in COLUMNS) + " |")
    for p in points:
        if p["first_errors"]:
            print(f"N={p['clients']}: errors: {p['first_errors']}")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    question = spoken_question(args.kit / "question.wav" if args.kit else args.question)
    points = []
    for clients in args.clients:
        points.append(await run_point(args, clients, question))
        print(json.dumps(points[-1]), file=sys.stderr, flush=True)
    turn_end = "client commits" if args.client_commit else f"server_vad {args.silence_ms} ms"
    where = "in process" if args.llm == "in-process" else f"in a server of {args.llm_server_workers} workers"
    llm = (
        f"LLM stand-in {args.llm_first_token_ms:g} ms + {args.llm_tokens_per_s:g} tok/s"
        if args.llm == "stand-in"
        else f"LLM {where} ({args.llm_folder or 'the shipped model'}, {args.llm_max_tokens} tokens a reply)"
    )
    mps = f"MPS, agent {args.mps_agent_priority}; " if args.mps else ""
    print(
        f"voice agent, STT/TTS {args.shape} on {args.device_name}; {llm}; question every {args.period:g} s; "
        f"{turn_end}; {mps}{args.duration - args.warmup:.0f} s measured; ms"
    )
    print_table(points)
    return {
        "benchmark": "bench_voice_agent",
        "shape": args.shape,
        "device": args.device_name,
        "llm": {
            "stand_in": "paced_llm.py",
            "first_token_ms": args.llm_first_token_ms,
            "tokens_per_s": args.llm_tokens_per_s,
            "reply_words": args.llm_reply_words,
        }
        if args.llm == "stand-in"
        else {
            args.llm.replace("-", "_"): str(args.llm_folder or "shipped"),
            "server_workers": args.llm_server_workers if args.llm == "server" else None,
            "max_active": args.llm_max_active,
            "max_tokens": args.llm_max_tokens,
        },
        "period_s": args.period,
        "silence_ms": None if args.client_commit else args.silence_ms,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "client_procs": args.client_procs,
        "mps": args.mps,
        "mps_agent_priority": args.mps_agent_priority if args.mps else None,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "points": points,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="tiny: the tests' CPU checkpoints")
    parser.add_argument("--clients", type=int, nargs="+", default=[2])
    parser.add_argument("--workers", type=int, default=1, help="front-end workers (1: one process)")
    parser.add_argument(
        "--tts-server-workers",
        type=int,
        default=0,
        help="the TTS in a server of its own with this many workers, spoken through (0: in the engine process)",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of speech per N")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before turns count")
    parser.add_argument("--period", type=float, default=15.0, help="seconds between one client's questions")
    parser.add_argument("--silence-ms", type=int, default=500, help="server_vad silence_duration_ms")
    parser.add_argument(
        "--client-commit",
        action="store_true",
        help="no server VAD: each client commits and asks for the reply at the end of its question",
    )
    parser.add_argument("--client-procs", type=int, default=1, help="load generator processes")
    parser.add_argument(
        "--llm",
        choices=("stand-in", "in-process", "server"),
        default="stand-in",
        help="the replies' LLM: the paced stand-in, or the cascade's continuously batched transformers runtime "
        "(--shape real: random weights of --llm-shape on the GPU; tiny: the shipped SmolLM2-135M on the CPU) "
        "in the agent's engine process or in an rtserve of its own reached as a vLLM",
    )
    parser.add_argument("--llm-server-workers", type=int, default=2, help="--llm server: its front-end workers")
    parser.add_argument(
        "--llm-shape",
        choices=sorted(LLM_SHAPES),
        default="llama-3.2-1b",
        help="the embedded LLM (in-process, server), --shape real: the random model's published shape",
    )
    parser.add_argument("--llm-max-active", type=int, default=64, help="the embedded LLM: replies decoded together")
    parser.add_argument(
        "--llm-max-tokens",
        type=int,
        default=16,
        help="the embedded LLM: the sessions' reply cap (the stand-in's length)",
    )
    parser.add_argument("--llm-first-token-ms", type=float, default=100.0, help="the LLM stand-in's first token")
    parser.add_argument("--llm-tokens-per-s", type=float, default=50.0, help="the LLM stand-in's rate per reply")
    parser.add_argument(
        "--llm-reply-words",
        type=int,
        nargs=2,
        default=(8, 12),
        help="the stand-in's reply length range (~3-4 s spoken)",
    )
    parser.add_argument("--server-threads", type=int, help="OMP_NUM_THREADS of the server; default: unset")
    parser.add_argument("--weights-dir", type=Path, help="where the random weights are written (kept, reused)")
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument(
        "--question",
        type=Path,
        default=ROOT / "benchmarks" / "results" / "voice_agent_question.wav",
        help="the spoken question (24 kHz mono PCM16 WAV); written with Piper when missing",
    )
    parser.add_argument(
        "--kit",
        type=Path,
        help="a host without the embedded CPU models: voice_agent_kit.py's folder (its models, question)",
    )
    parser.add_argument(
        "--set", nargs="*", action="extend", default=[], help="more server settings, RTSERVE_X=VALUE (repeatable)"
    )
    parser.add_argument(
        "--tts-set",
        nargs="*",
        action="extend",
        default=[],
        help="more settings of the TTS server (--tts-server-workers), RTSERVE_X=V (repeatable)",
    )
    parser.add_argument(
        "--profile-engine",
        type=Path,
        help="py-spy the engine process over each measured window into this raw profile; prints where it went",
    )
    parser.add_argument(
        "--profile-tts",
        type=Path,
        help="the same for the TTS server's engine process (--tts-server-workers), into this raw profile",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="run under an MPS daemon of the run's own (cuda_mps.py): the servers' CUDA contexts share the GPU",
    )
    parser.add_argument(
        "--mps-agent-priority",
        choices=sorted(cuda_mps.CLIENT_PRIORITIES),
        default="below_normal",
        help="--mps: the voice agent's MPS client priority (the TTS server's and the LLM server's: normal)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.duration < args.warmup + args.period + REPLY_ROOM_S + 2:
        parser.error("--duration must cover --warmup, one --period and a reply, so every client's turn counts")
    if args.profile_tts and not args.tts_server_workers:
        parser.error("--profile-tts profiles the TTS server: give --tts-server-workers")
    if args.shape == "tiny" and args.mps:
        parser.error("--mps is for a CUDA GPU (--shape real)")
    # Before this process touches CUDA, so it is a client of the daemon as its children are.
    with cuda_mps.mps_daemon() if args.mps else contextlib.nullcontext():
        run(args, parser)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    base = args.weights_dir or ROOT / "benchmarks" / "results" / "weights"
    stt_shape, tts_shape = SHAPES[args.shape]
    # The same folders as bench_kyutai_served's, so either benchmark reuses the other's weights.
    args.stt_folder, args.tts_folder = base / f"asr-{stt_shape}", base / f"tts-{tts_shape}"
    # In a child: this process then never opens a CUDA context, so under --mps it is not one of
    # the daemon's clients and the daemon can quit as soon as the servers have.
    random_llm = args.llm != "stand-in" and args.shape == "real"
    args.llm_folder = base / f"llm-{args.llm_shape}" if random_llm else None
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        args.cuda, args.device_name, args.voices = child.submit(
            prepare_weights, args.shape, args.stt_folder, args.tts_folder
        ).result()
        if args.cuda and args.llm_folder is not None:
            tokenizer = voice_agent_kit.llm_tokenizer(args.kit) if args.kit else shipped_tokenizer()
            child.submit(write_random_llm, args.llm_folder, tokenizer, args.llm_shape).result()
    if args.shape == "real" and not args.cuda:
        parser.error("--shape real needs a CUDA GPU (1B + 1.6B parameters stepped every 80 ms)")
    result = asyncio.run(main_async(args))
    path = args.json or ROOT / "benchmarks" / "results" / "bench_voice_agent.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def prepare_weights(shape: str, stt_folder: Path, tts_folder: Path) -> tuple[bool, str, Path]:
    """Write (or keep) the random weights of ``shape``; return whether the servers run on CUDA,
    the device's name and the voices folder."""
    import torch

    cuda = shape != "tiny" and torch.cuda.is_available()
    if shape == "real" and not cuda:
        return False, "cpu", tts_folder
    stt_shape, tts_shape = SHAPES[shape]
    write_stt_weights(stt_folder, stt_shape)
    voices = write_tts_weights(tts_folder, tts_shape)
    return cuda, torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)", voices


if __name__ == "__main__":
    main()
