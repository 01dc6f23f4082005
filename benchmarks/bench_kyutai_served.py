"""The Kyutai speech engines served over moshi-server's protocols, with paced clients in several
processes (issues 32, 33): ``WS /api/asr-streaming`` (``--route asr``) and ``WS /api/tts_streaming``
(``--route tts``), one ``rtserve serve`` child per client count N (``server_process.py``).

Weights: random weights of the published shapes (``bench_kyutai_stt.SHAPES``: ``stt-1b``,
``stt-2.6b``; ``bench_kyutai_tts.TTS_1_6B``: ``tts-1.6b``), written once into ``--weights-dir`` in
Kyutai's folder layout (the tests' writers save them) and loaded by the server as real weights.
``--shape tiny`` is the tests' tiny checkpoint on the CPU. ``--shape whisper`` (asr) configures no
STT weights: the route is served by the default engine's Whisper behind the VAD, and the clients
speak Piper speech fetched from the same server.

ASR clients send msgpack ``Audio`` messages of 80 ms (encoded once) every 80 ms on an absolute
schedule, at phases spread over the period, and a ``Marker`` after every ``--marker-every``-th
frame. Reported over the steady window (after ``--warmup``):

* step latency p50/p99: frame k sent -> the ``Step`` of the tick that consumed it arrived. The
  marker after frame k is answered ``delay`` steps after that tick (``Step`` then ``Marker`` in one
  tick's messages), so that Step's index is the marker's minus the model's delay in frames;
* standing: whole frames of a stream's input queued beyond its tick, per stream and tick (the
  engine's ``standing_input_frames`` counter): x 80 ms, what a standing backlog adds to the step
  latency; drained: the frames drain steps took between ticks, per stream and tick (``--no-drain``
  turns them off: docs/engines.md#draining-waiting-input);
* underruns: ticks that stepped a stream with silence for lack of its audio, from the same markers
  (a stream's step index minus its frame index grows by one per underrun; STT keeps every sample,
  so each one is 80 ms of lasting latency);
* step cadence lateness p99: each Step's arrival against the stream's 80 ms grid (a tick over its
  period, or a stalled front end, shows here);
* word latency p50/p99: per ``Word``, its arrival minus the send time of the audio at its
  ``start_time``; with random weights the words are random token runs, so this holds their random
  lengths (Whisper: also end of utterance -> its words);
* server CPU (busiest process, % of one core) and the load generator's; the GPU's busy share
  (``gpu_busy``: nvidia-smi's utilization over the window).

TTS clients (one connection per reply, as moshi-server's) send 8-20 ``Text`` words at
``--words-per-s`` on a schedule, then ``Eos``, read the audio, and start the next reply once the
server has closed the previous one (``--think-s`` later). Reported: first audio (first word sent -> first
``Audio``) p50/p95 and the engine's share of it (``rtserve_kyutai_tts_first_audio_seconds``:
first text received -> first audio handed out, in the engine process; ``after text``: from the text
the reply last waited for, ``rtserve_kyutai_tts_first_audio_after_text_seconds``; ``p95 @audio``: the
clients' p95 over the replies the engine counts, those whose first audio came in the window), audio stalls once
started (an ``Audio`` arriving after everything before it would have played out at real time),
replies and errors.

Server side, over the same window: the engine's tick and batched-step p50/p99 from its lockstep
histograms on /metrics (``rtserve_kyutai_stt_*`` / ``rtserve_kyutai_tts_*``, bucket-interpolated).

    python benchmarks/bench_kyutai_served.py --route asr --shape stt-1b --clients 256 512 --client-procs 8
    python benchmarks/bench_kyutai_served.py --route tts --shape tts-1.6b --clients 64 128 --client-procs 4
    .venv/bin/python benchmarks/bench_kyutai_served.py --route asr --shape tiny --clients 2 --duration 6
    .venv/bin/python benchmarks/bench_kyutai_served.py --route asr --shape whisper --clients 1 2 4 8

Prints a table; JSON to ``benchmarks/results/bench_kyutai_served_<route>.json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import gpu_busy
import msgpack
import numpy as np
import pyspy
from load_shards import ShardResult, gather_shards, merge_logs, run_shard, split  # benchmarks/ is on sys.path
from server_process import (
    NotReady,
    ServerProcess,
    full_collections,
    histogram_mean,
    histogram_quantile,
    scrape,
    tick_parts_p99_ms,
)

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.kyutai_tts.frame_model import STEP_KINDS

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first

RATE = 24_000
FRAME = 1920
PERIOD_S = FRAME / RATE
VOICE = "bench"
GPU_MEMORY = 'rtserve_torch_cuda_memory_bytes{{device="0",kind="{}"}}'  # /metrics, kind: allocated, reserved
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "we",
    "talk",
    "about",
    "music",
    "books",
    "and",
    "sunny",
    "weather",
]


# ---------------------------------------------------------------- weights


def write_stt_weights(folder: Path, shape: str) -> dict[str, Any]:
    """A Kyutai STT folder of ``shape`` with random weights in ``folder`` (kept: written once);
    returns its ``stt_config``."""
    import torch

    from rtserve.engines.moshi.lm_config import LMConfig

    if shape == "tiny":
        from tests.engines.kyutai_stt.stt_tiny import STT_CONFIG, write_stt_checkpoint

        if not (folder / "config.json").exists():
            write_stt_checkpoint(folder)
        return STT_CONFIG
    import sentencepiece
    from bench_kyutai_stt import SHAPES
    from moshi_build import mimi_config, random_reference_lm

    from tests.engines.kyutai_stt.stt_tiny import lean_to_padding, save_stt_checkpoint
    from tests.engines.moshi.tiny import reference_mimi, train_tokenizer

    kwargs, stt = SHAPES[shape]
    if (folder / "config.json").exists():
        return stt
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lm = random_reference_lm(kwargs, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    config = LMConfig.from_dict(kwargs)
    lean_to_padding(lm, config.text_padding_id, config.text_end_padding_id)
    # The published text head has thousands of ids, the tokenizer written beside it a few dozen
    # pieces: the head's rows past them get logit 0, below the best random row, so the random
    # model only says ids the tokenizer can spell (the same tokenizer is trained again on save).
    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(folder / "tokenizer.model")
    vocab = sentencepiece.SentencePieceProcessor(str(folder / "tokenizer.model")).vocab_size()
    with torch.no_grad():
        lm.text_linear.weight[vocab:] = 0
    mcfg = mimi_config("full", kwargs["card"])
    mcfg["quantizer"]["n_q"] = kwargs["n_q"]
    save_stt_checkpoint(folder, lm, reference_mimi(mcfg), lm_kwargs=kwargs, stt_config=stt, mimi_config=mcfg)
    return stt


def write_tts_weights(folder: Path, shape: str) -> Path:
    """A Kyutai TTS folder of ``shape`` with random weights and one voice named ``VOICE``; returns
    the voices folder."""
    import torch
    from safetensors.torch import save_file

    voices = folder / "voices"
    if shape == "tiny":
        from tests.engines.kyutai_tts.tiny import write_tts_checkpoint, write_voice

        if not (folder / "config.json").exists():
            write_tts_checkpoint(folder)
            write_voice(voices / f"{VOICE}.safetensors", 3)
        return voices
    from bench_kyutai_tts import TTS_1_6B, VOICE_FRAMES, random_reference_tts_lm
    from moshi_build import mimi_config

    from tests.engines.kyutai_tts.tiny import save_tts_checkpoint
    from tests.engines.moshi.tiny import reference_mimi

    if (folder / "config.json").exists():
        return voices
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lm = random_reference_tts_lm(TTS_1_6B, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    mcfg = mimi_config("full", TTS_1_6B["card"])
    mcfg["quantizer"]["n_q"] = TTS_1_6B["n_q"]
    save_tts_checkpoint(folder, lm, reference_mimi(mcfg), raw=TTS_1_6B, mimi_config=mcfg)
    voices.mkdir(parents=True, exist_ok=True)
    dim = TTS_1_6B["conditioners"]["speaker_wavs"]["tensor"]["dim"]
    voice = torch.randn(1, dim, VOICE_FRAMES, generator=torch.Generator().manual_seed(1))
    save_file({"speaker_wavs": voice}, str(voices / f"{VOICE}.safetensors"))
    return voices


# ---------------------------------------------------------------- ASR clients


@dataclass
class AsrLog:
    send_times: list[float] = field(default_factory=list)  # per audio frame
    send_lag_ms: list[float] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)  # (step_idx, arrival)
    markers: list[tuple[int, int, float]] = field(default_factory=list)  # (frame index, last step_idx, arrival)
    words: list[tuple[float, float]] = field(default_factory=list)  # (start_time, arrival)
    error: str | None = None


def _pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_single_float=True)
    return packed


def audio_messages(signal: FloatArray) -> list[bytes]:
    return [
        _pack({"type": "Audio", "pcm": signal[j * FRAME : (j + 1) * FRAME].tolist()})
        for j in range(len(signal) // FRAME)
    ]


async def expect_ready(ws: aiohttp.ClientWebSocketResponse) -> None:
    """moshi-server's first message on both routes; anything else (an ``Error``) fails the client."""
    ready = await ws.receive(timeout=60)
    if ready.type is not aiohttp.WSMsgType.BINARY or msgpack.unpackb(ready.data).get("type") != "Ready":
        raise RuntimeError(f"no Ready: {ready.type} {ready.data!r:.200}")


async def asr_client(
    http: aiohttp.ClientSession,
    url: str,
    frames: list[bytes],
    marker_every: int,
    start_at: float,
    log: AsrLog,
    open_at_start: bool = False,
) -> None:
    """``open_at_start``: connect at ``start_at`` and send from ``Ready`` on, as a microphone does
    (else connect first and send from ``start_at``: a stream's slot has finished its prefill)."""
    loop = asyncio.get_running_loop()
    try:
        if open_at_start:
            await asyncio.sleep(max(0.0, start_at - loop.time()))
        async with http.ws_connect(url, max_msg_size=0) as ws:
            await expect_ready(ws)
            if open_at_start:
                start_at = loop.time()

            async def receive() -> None:
                last_step = 0
                async for message in ws:
                    if message.type is not aiohttp.WSMsgType.BINARY:
                        continue
                    now = loop.time()
                    event = msgpack.unpackb(message.data)
                    kind = event.get("type")
                    if kind == "Step":
                        last_step = event["step_idx"]
                        log.steps.append((last_step, now))
                    elif kind == "Marker":
                        log.markers.append((event["id"], last_step, now))
                    elif kind == "Word":
                        log.words.append((event["start_time"], now))
                    elif kind == "Error":
                        log.error = f"Error {event.get('code')}: {event.get('message')}"

            receiver = asyncio.create_task(receive())
            for j, data in enumerate(frames):
                due = start_at + j * PERIOD_S
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await ws.send_bytes(data)
                now = loop.time()
                log.send_times.append(now)
                log.send_lag_ms.append((now - due) * 1e3)
                if marker_every and (j + 1) % marker_every == 0:
                    await ws.send_bytes(_pack({"type": "Marker", "id": j}))
            await asyncio.sleep(3.0)  # the model's delay, so the last markers and words come back
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    except Exception as exc:  # noqa: BLE001 - any failure is recorded, reported as an error count
        log.error = log.error or f"{type(exc).__name__}: {exc}"


async def run_asr_clients(
    url: str, frames: list[bytes], marker_every: int, starts: list[float], open_at_start: bool
) -> list[AsrLog]:
    logs = [AsrLog() for _ in starts]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(
            *(
                asr_client(http, url, frames, marker_every, s, log, open_at_start)
                for s, log in zip(starts, logs, strict=True)
            )
        )
    return logs


def asr_shard(
    url: str,
    frames: list[bytes],
    marker_every: int,
    starts: list[float],
    window: tuple[float, float],
    open_at_start: bool,
) -> ShardResult[AsrLog]:
    return run_shard(lambda: run_asr_clients(url, frames, marker_every, starts, open_at_start), window)


Timed = list[tuple[float, float]]  # (send time of the audio concerned, ms)


def asr_analyse(log: AsrLog, window: tuple[float, float], delay_frames: int) -> dict[str, Any]:
    """One stream's step latencies, underruns, cadence lateness and word latencies in ``window``."""
    sent = log.send_times
    step_at = dict(log.steps)
    latencies: Timed = []
    offsets: list[int] = []  # step index minus frame index, per marker in the window
    for frame, step, _arrival in log.markers:
        if frame >= len(sent) or not window[0] <= sent[frame] <= window[1]:
            continue
        consumed = step - delay_frames  # the Step of the tick that took frame ``frame``
        offsets.append(consumed - frame)
        if consumed in step_at:
            latencies.append((sent[frame], (step_at[consumed] - sent[frame]) * 1e3))
    arrivals = np.asarray([t for _, t in log.steps if window[0] <= t <= window[1]])
    lateness: list[float] = []
    if len(arrivals) > 1:
        cadence = arrivals - np.arange(len(arrivals)) * PERIOD_S
        lateness = list((cadence - cadence.min()) * 1e3)
    words: Timed = []
    for start_time, arrival in log.words:
        frame = int(start_time / PERIOD_S)
        if frame < len(sent) and window[0] <= sent[frame] <= window[1]:
            words.append((sent[frame], (arrival - sent[frame]) * 1e3))
    return {
        "step_latency_ms": latencies,
        "underruns": [max(offsets) - offsets[0] if offsets else 0],
        "lateness_ms": lateness,
        "word_latency_ms": words,
    }


# ---------------------------------------------------------------- TTS clients


@dataclass
class Reply:
    words: int
    first_sent: float = 0.0
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples)
    texts: int = 0
    error: str | None = None


@dataclass
class TtsLog:
    replies: list[Reply] = field(default_factory=list)
    error: str | None = None


def reply_scripts(count: int, seed: int) -> list[list[bytes]]:
    """``count`` replies of 8-20 words, each word one pre-packed ``Text`` message."""
    gen = np.random.default_rng(seed)
    return [
        [_pack({"type": "Text", "text": str(w)}) for w in gen.choice(WORDS, int(gen.integers(8, 21)))]
        for _ in range(count)
    ]


async def tts_reply(http: aiohttp.ClientSession, url: str, script: list[bytes], words_per_s: float) -> Reply:
    loop = asyncio.get_running_loop()
    reply = Reply(len(script))
    try:
        async with http.ws_connect(url, max_msg_size=0) as ws:
            await expect_ready(ws)

            async def receive() -> None:
                async for message in ws:
                    if message.type is not aiohttp.WSMsgType.BINARY:
                        continue
                    now = loop.time()
                    event = msgpack.unpackb(message.data)
                    kind = event.get("type")
                    if kind == "Audio":
                        reply.audio.append((now, len(event["pcm"])))
                    elif kind == "Text":
                        reply.texts += 1
                    elif kind == "Error":
                        reply.error = f"Error {event.get('code')}: {event.get('message')}"

            receiver = asyncio.create_task(receive())
            start = loop.time()
            for i, data in enumerate(script):
                delay = start + i / words_per_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await ws.send_bytes(data)
                if i == 0:
                    reply.first_sent = loop.time()
            await ws.send_bytes(_pack({"type": "Eos"}))
            await asyncio.wait_for(receiver, 120)  # the server closes once the speech is out
    except Exception as exc:  # noqa: BLE001 - any failure is recorded, reported as an error count
        reply.error = reply.error or f"{type(exc).__name__}: {exc}"
    return reply


async def tts_client(
    http: aiohttp.ClientSession,
    url: str,
    scripts: list[list[bytes]],
    words_per_s: float,
    start_at: float,
    stop_at: float,
    think_s: float,
    log: TtsLog,
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    index = 0
    while loop.time() < stop_at:
        reply = await tts_reply(http, url, scripts[index % len(scripts)], words_per_s)
        index += 1
        log.replies.append(reply)
        if reply.error:
            log.error = reply.error
        # Back to back by default: every stream is generating all the time (the most load N streams make).
        await asyncio.sleep(max(think_s, 1.0 if reply.error else 0.0))


async def run_tts_clients(
    url: str, scripts: list[list[bytes]], words_per_s: float, starts: list[float], stop_at: float, think_s: float
) -> list[TtsLog]:
    logs = [TtsLog() for _ in starts]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(
            *(
                tts_client(http, url, scripts[k :: len(starts)] or scripts, words_per_s, s, stop_at, think_s, log)
                for k, (s, log) in enumerate(zip(starts, logs))
            )
        )
    return logs


def tts_shard(
    url: str,
    scripts: list[list[bytes]],
    words_per_s: float,
    starts: list[float],
    stop_at: float,
    think_s: float,
    window: tuple[float, float],
) -> ShardResult[TtsLog]:
    return run_shard(lambda: run_tts_clients(url, scripts, words_per_s, starts, stop_at, think_s), window)


def stalls(reply: Reply) -> tuple[int, float]:
    """(stalls, ms stalled) of a reply played from its first audio at real time: an ``Audio``
    arriving after everything before it had played out."""
    if not reply.audio:
        return 0, 0.0
    count, stalled = 0, 0.0
    ends = reply.audio[0][0]
    for arrival, samples in reply.audio:
        if arrival > ends + 1e-3:
            count += 1
            stalled += arrival - ends
            ends = arrival
        ends += samples / RATE
    return count, stalled * 1e3


# ---------------------------------------------------------------- runs


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def noise(seconds: float) -> FloatArray:
    return (0.1 * np.random.default_rng(0).standard_normal(int(seconds * RATE))).astype(np.float32)


async def piper_speech(http: aiohttp.ClientSession, base: str, seconds: float) -> tuple[FloatArray, list[int]]:
    """Spoken sentences (the server's Piper voice) with 1 s pauses, ``seconds`` long, and the sample
    index where each utterance ends."""
    body = {"model": "piper-joe", "voice": "joe", "input": "What is the capital of France? Tell me a story about it."}
    async with http.post(f"{base}/v1/audio/speech", json={**body, "response_format": "pcm"}) as response:
        response.raise_for_status()
        speech = np.frombuffer(await response.read(), "<i2").astype(np.float32) / 32768
    pause = np.zeros(RATE, np.float32)
    pieces, ends, length = [], [], 0
    while length < seconds * RATE:
        pieces += [speech, pause]
        length += speech.size + pause.size
        ends.append(length - pause.size)
    return np.concatenate(pieces)[: int(seconds * RATE)], ends


async def ready_probe(url: str) -> Any:
    async def probe(http: aiohttp.ClientSession) -> bool:
        async with http.ws_connect(url) as ws:
            message = await ws.receive(timeout=10)
            if message.type is not aiohttp.WSMsgType.BINARY:
                raise NotReady(f"{message.type.name} {str(message.data)[:300]}")
            answer = msgpack.unpackb(message.data)
            if answer.get("type") != "Ready":
                raise NotReady(f"first message {str(answer)[:300]}")
            return True

    return probe


def server_env(args: argparse.Namespace, clients: int) -> tuple[dict[str, str], str]:
    """The server's ``RTSERVE_*`` settings and its ``--engine``."""
    device = "cuda" if args.cuda else "cpu"
    dtype = "bfloat16" if args.cuda else "float32"
    if args.route == "asr":
        if args.shape == "whisper":
            return {}, "cascade"
        env = {
            "RTSERVE_STT_ENGINE__WEIGHTS": str(args.folder),
            "RTSERVE_STT_ENGINE__DEVICE": device,
            "RTSERVE_STT_ENGINE__DTYPE": dtype,
            "RTSERVE_STT_ENGINE__BATCH_SIZE": str(clients),
            "RTSERVE_STT_ENGINE__KV_CACHE": args.kv_cache,
            "RTSERVE_STT_ENGINE__DRAIN_WAITING_INPUT": "false" if args.no_drain else "true",
        }
        return env, "loopback"
    env = {
        "RTSERVE_TTS_ENGINE__WEIGHTS": str(args.folder),
        "RTSERVE_TTS_ENGINE__VOICES": str(args.voices),
        "RTSERVE_TTS_ENGINE__DEFAULT_VOICE": VOICE,
        "RTSERVE_TTS_ENGINE__DEVICE": device,
        "RTSERVE_TTS_ENGINE__DTYPE": dtype,
        "RTSERVE_TTS_ENGINE__MAX_SESSIONS": str(clients),
    }
    return env, "loopback"


async def run_point(args: argparse.Namespace, workers: int, clients: int) -> dict[str, Any]:
    env, engine = server_env(args, clients)
    if args.server_threads:  # torch's intra-op threads in the server (default: one per core)
        env["OMP_NUM_THREADS"] = str(args.server_threads)
    env.update(dict(setting.split("=", 1) for setting in args.set))
    started = time.monotonic()
    server = ServerProcess(env, engine=engine, name="bench_kyutai_served", workers=workers)
    ws_base = server.base.replace("http", "ws")
    url = ws_base + ("/api/asr-streaming" if args.route == "asr" else f"/api/tts_streaming?voice={VOICE}")
    try:
        async with aiohttp.ClientSession() as http:
            await server.wait_ready(http, timeout_s=args.ready_timeout, probe=await ready_probe(url))
            await asyncio.sleep(1.0)  # the probe's slot is freed at a tick after its close
            loaded = time.monotonic()
            ends: list[int] = []
            if args.route == "asr":
                if args.shape == "whisper":
                    signal, ends = await piper_speech(http, server.base, args.duration)
                else:
                    signal = noise(args.duration)
                frames = audio_messages(signal)
            start_at = time.monotonic() + 3.0 + 0.004 * clients
            window = (start_at + args.warmup, start_at + args.duration - 0.2)
            ranges = split(clients, args.client_procs)
            if args.route == "asr":
                marker_every = 0 if args.shape == "whisper" else args.marker_every
                jobs: list[tuple[Any, ...]] = [
                    (
                        url,
                        frames,
                        marker_every,
                        [start_at + PERIOD_S * i / clients for i in r],
                        window,
                        args.open_at_start,
                    )
                    for r in ranges
                ]
                shards: asyncio.Task[Any] = asyncio.create_task(gather_shards(asr_shard, jobs))
            else:
                scripts = reply_scripts(max(64, clients * 4), 0)
                stop_at = start_at + args.duration
                jobs = [
                    (url, scripts, args.words_per_s, [start_at + i / clients for i in r], stop_at, args.think_s, window)
                    for r in ranges
                ]
                shards = asyncio.create_task(gather_shards(tts_shard, jobs))
            await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
            cpu_before, metrics_before = server.cpu_by_process(), await scrape(http, server.base)
            spy = args.profile_engine
            profiler = pyspy.start(server.engine_pid(), window[1] - window[0], spy) if spy else None
            gpu = gpu_busy.start()
            try:
                await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
            finally:  # the sampler never outlives the window (a child process would)
                gpu_pct = gpu_busy.finish(gpu)
            cpu_after, metrics_after = server.cpu_by_process(), await scrape(http, server.base)
            await asyncio.to_thread(pyspy.report, profiler, spy, f"engine process, N={clients} workers={workers}")
            measured_s = window[1] - window[0]
            results = await shards
    finally:
        server.stop()
    logs = merge_logs(results, ranges, clients)
    point: dict[str, Any] = {
        "route": args.route,
        "shape": args.shape,
        "workers": workers,
        "clients": clients,
        "duration_s": args.duration,
        "load_s": round(loaded - started, 1),
        "server_cpu_pct": 100.0 * (sum(cpu_after.values()) - sum(cpu_before.values())) / measured_s,
        "busiest_server_pct": server.busiest_pct(cpu_before, cpu_after, measured_s),
        "gpu_busy_pct": gpu_pct,
        # The engine process's GPU memory in tensors, and taken from the driver (the allocator's cache too).
        "gpu_gb_allocated": metrics_after.get(GPU_MEMORY.format("allocated"), float("nan")) / 2**30,
        "gpu_gb_reserved": metrics_after.get(GPU_MEMORY.format("reserved"), float("nan")) / 2**30,
        "client_cpu_pct": 100.0 * sum(r.cpu_s for r in results) / measured_s,
        "busiest_client_pct": 100.0 * max(r.cpu_s for r in results) / measured_s,
        "errors": sum(log.error is not None for log in logs),
        "first_error": next((log.error for log in logs if log.error), None),
    }
    # The engine's scheduler histograms, as /metrics names them (rtserve_kyutai_stt_* / _tts_*);
    # the Whisper route has no lockstep scheduler: NaN.
    family = "rtserve_kyutai_stt_" if args.route == "asr" else "rtserve_kyutai_tts_"
    for name in ("tick", "step"):
        for q in (0.5, 0.99):
            seconds = histogram_quantile(metrics_before, metrics_after, f"{family}{name}_seconds", q)
            point[f"{name}_p{round(q * 100)}_ms"] = seconds * 1e3
    point |= tick_parts_p99_ms(metrics_before, metrics_after, family)  # which part of a long tick stalls
    point |= full_collections(metrics_before, metrics_after)  # or whether a collection held the GIL
    if args.route == "asr":
        point["standing_frames"] = standing_frames(metrics_before, metrics_after, family, clients)
        point["drained_frames"] = per_stream_tick(
            metrics_before, metrics_after, family, "drained_input_frames", clients
        )
        point |= asr_point(args, logs, window, ends)
    else:
        point |= tts_point(logs, window)
        for q in (0.5, 0.95):  # the engine's share: first text received -> first audio handed out
            seconds = histogram_quantile(metrics_before, metrics_after, f"{family}first_audio_seconds", q)
            point[f"engine_first_audio_p{round(q * 100)}_ms"] = seconds * 1e3
            # of which the engine's own: from the text the reply last waited for
            seconds = histogram_quantile(metrics_before, metrics_after, f"{family}first_audio_after_text_seconds", q)
            point[f"engine_after_text_p{round(q * 100)}_ms"] = seconds * 1e3
        point |= first_audio_steps(metrics_before, metrics_after)
    return point


def standing_frames(before: dict[str, float], after: dict[str, float], family: str, streams: int) -> float:
    """Whole frames a stream's input waited beyond its own tick, per stream and tick, on average
    (``*_standing_input_frames``): times 80 ms, the step latency that a standing backlog adds."""
    return per_stream_tick(before, after, family, "standing_input_frames", streams)


def per_stream_tick(
    before: dict[str, float], after: dict[str, float], family: str, counter: str, streams: int
) -> float:
    """A lockstep counter's growth over the window per stream and paced tick (``drained_input_frames``:
    the frames drain steps took, docs/engines.md#draining-waiting-input)."""
    ticks = after.get(f"{family}tick_seconds_count", 0.0) - before.get(f"{family}tick_seconds_count", 0.0)
    name = f"{family}{counter}_total"
    return (after.get(name, 0.0) - before.get(name, 0.0)) / (ticks * streams) if ticks else float("nan")


def first_audio_steps(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Where the engine's share of first audio goes: a reply's full and pre-audio steps before its
    first audio (p50, p95), the replies that found the young batch full and their wait for a row
    (p99 over all replies), and the share of the
    model's steps that were full steps while a young reply waited, by reason
    (``rtserve_kyutai_tts_model_steps``; docs/engines.md#pre-audio-steps), and the slots and ring
    slots a main-batch step computed on average (docs/engines.md#row-buckets)."""
    point = {
        f"first_{kind}_steps_p{round(q * 100)}": histogram_quantile(
            before, after, "rtserve_kyutai_tts_first_audio_steps", q, f'kind="{kind}"'
        )
        for kind in ("full", "pre_audio")
        for q in (0.5, 0.95)
    }
    full = "rtserve_kyutai_tts_young_batch_full_total"
    point["young_batch_full"] = after.get(full, 0.0) - before.get(full, 0.0)
    # How long the replies that found it full waited for a young row (0 for the others).
    point["young_wait_p99_ms"] = 1e3 * histogram_quantile(before, after, "rtserve_kyutai_tts_young_wait_seconds", 0.99)
    steps = {
        kind: sum(
            value - before.get(key, 0.0)
            for key, value in after.items()
            if key.startswith("rtserve_kyutai_tts_model_steps_total") and f'kind="{kind}"' in key
        )
        for kind in STEP_KINDS
    }
    total = sum(steps.values()) or float("nan")
    point |= {
        f"step_{part}": histogram_mean(before, after, f"rtserve_kyutai_tts_step_{part}") for part in ("rows", "span")
    }
    return point | {f"steps_{kind}_pct": 100.0 * count / total for kind, count in steps.items()}


def asr_point(
    args: argparse.Namespace, logs: list[AsrLog], window: tuple[float, float], ends: list[int]
) -> dict[str, Any]:
    merged: dict[str, list[Any]] = {}
    utterance_latency: Timed = []
    for log in logs:
        for key, values in asr_analyse(log, window, args.delay_frames).items():
            merged.setdefault(key, []).extend(values)
        for start_time, arrival in log.words:  # Whisper: the end of the utterance the word is in
            end = next((e for e in ends if e / RATE >= start_time), None)
            frame = None if end is None else (end - 1) // FRAME
            if frame is not None and frame < len(log.send_times) and window[0] <= log.send_times[frame] <= window[1]:
                utterance_latency.append((log.send_times[frame], (arrival - log.send_times[frame]) * 1e3))
    frames_in_window = sum(sum(window[0] <= t <= window[1] for t in log.send_times) for log in logs)
    steps, words = merged["step_latency_ms"], merged["word_latency_ms"]
    return {
        "delay_ms": args.delay_frames * PERIOD_S * 1e3,
        "step_latency_p50_ms": _pct([v for _, v in steps], 50),
        "step_latency_p99_ms": _pct([v for _, v in steps], 99),
        "step_latency_growth_ms": growth_ms(steps, window),
        "step_latency_samples": len(steps),
        "underruns": sum(merged["underruns"]),
        "frames": frames_in_window,
        "cadence_late_p99_ms": _pct(merged["lateness_ms"], 99),
        "cadence_late_max_ms": max(merged["lateness_ms"], default=float("nan")),
        "words": len(words),
        "word_latency_p50_ms": _pct([v for _, v in words], 50),
        "word_latency_p99_ms": _pct([v for _, v in words], 99),
        "utterance_end_to_word_p50_ms": _pct([v for _, v in utterance_latency], 50),
        "utterance_end_to_word_p99_ms": _pct([v for _, v in utterance_latency], 99),
        "utterance_end_to_word_growth_ms": growth_ms(utterance_latency, window),
        "send_lag_p99_ms": _pct([v for log in logs for v in log.send_lag_ms], 99),
    }


def growth_ms(timed: Timed, window: tuple[float, float]) -> float:
    """Mean latency of the window's last third minus its first third: ~0 when the server keeps up,
    growing with the run's length when it falls behind real time."""
    third = (window[1] - window[0]) / 3
    first = [v for t, v in timed if t < window[0] + third]
    last = [v for t, v in timed if t >= window[1] - third]
    return float(np.mean(last) - np.mean(first)) if first and last else float("nan")


def _first_audio_ms(reply: Reply) -> float:
    return (reply.audio[0][0] - reply.first_sent) * 1e3


def tts_point(logs: list[TtsLog], window: tuple[float, float]) -> dict[str, Any]:
    replies = [r for log in logs for r in log.replies if window[0] <= r.first_sent <= window[1]]
    firsts = [_first_audio_ms(r) for r in replies if r.audio and not r.error]
    # The engine's histograms count a reply when its first audio comes inside the window, some
    # of them sent before it (a start's herd): these are the replies the engine's p95 is over.
    audio_in_window = [
        _first_audio_ms(r)
        for log in logs
        for r in log.replies
        if r.audio and not r.error and window[0] <= r.audio[0][0] <= window[1]
    ]
    stall_counts = [stalls(r) for r in replies if not r.error]
    audio_s = sum(n for r in replies for _, n in r.audio) / RATE
    return {
        "replies": len(replies),
        "failed_replies": sum(r.error is not None for r in replies),
        "first_audio_p50_ms": _pct(firsts, 50),
        "first_audio_p95_ms": _pct(firsts, 95),
        "first_audio_max_ms": max(firsts, default=float("nan")),
        "first_audio_by_audio_p95_ms": _pct(audio_in_window, 95),
        "stalls": sum(c for c, _ in stall_counts),
        "replies_with_stalls": sum(c > 0 for c, _ in stall_counts),
        "stalled_ms_total": sum(ms for _, ms in stall_counts),
        "audio_s": audio_s,
        "words_spoken": sum(r.texts for r in replies),
        "words_sent": sum(r.words for r in replies),
        # (first word sent, s into the window; its first audio, ms): whether slow ones cluster in time
        "first_audio_by_time": sorted(
            (round(r.first_sent - window[0], 3), round(_first_audio_ms(r), 1))
            for r in replies
            if r.audio and not r.error
        ),
    }


# Both routes' tables: the point and the engine's tick first, the host's load last.
SERVER_COLUMNS = [
    ("workers", "workers", "{}"),
    ("N", "clients", "{}"),
    ("load s", "load_s", "{:.0f}"),
    ("tick p50", "tick_p50_ms", "{:.1f}"),
    ("tick p99", "tick_p99_ms", "{:.1f}"),
    ("eng step p99", "step_p99_ms", "{:.1f}"),
    ("ctl p99", "control_p99_ms", "{:.1f}"),
    ("gath p99", "gather_p99_ms", "{:.1f}"),
    ("scat p99", "scatter_p99_ms", "{:.1f}"),
]
HOST_COLUMNS = [
    ("srv cpu", "server_cpu_pct", "{:.0f}%"),
    ("busiest", "busiest_server_pct", "{:.0f}%"),
    ("gpu", "gpu_busy_pct", "{:.0f}%"),
    ("GPU GB", "gpu_gb_reserved", "{:.1f}"),
    ("in tensors", "gpu_gb_allocated", "{:.1f}"),
    ("client max", "busiest_client_pct", "{:.0f}%"),
    ("errors", "errors", "{}"),
]
ASR_COLUMNS = [
    *SERVER_COLUMNS,
    ("gc2", "gc_full_collections", "{:.0f}"),
    ("gc2 p99", "gc_full_pause_p99_ms", "{:.0f}"),
    ("eng gc2", "engine_gc_full_collections", "{:.0f}"),
    ("eng gc2 p99", "engine_gc_full_pause_p99_ms", "{:.0f}"),
    ("step p50", "step_latency_p50_ms", "{:.1f}"),
    ("step p99", "step_latency_p99_ms", "{:.1f}"),
    ("step grow", "step_latency_growth_ms", "{:.0f}"),
    ("standing", "standing_frames", "{:.2f}"),
    ("drained", "drained_frames", "{:.3f}"),
    ("underruns", "underruns", "{}"),
    ("frames", "frames", "{}"),
    ("late p99", "cadence_late_p99_ms", "{:.1f}"),
    ("late max", "cadence_late_max_ms", "{:.1f}"),
    ("words", "words", "{}"),
    ("word p50", "word_latency_p50_ms", "{:.0f}"),
    ("word p99", "word_latency_p99_ms", "{:.0f}"),
    ("utt->word p50", "utterance_end_to_word_p50_ms", "{:.0f}"),
    ("utt->word p99", "utterance_end_to_word_p99_ms", "{:.0f}"),
    ("utt grow", "utterance_end_to_word_growth_ms", "{:.0f}"),
    ("delay", "delay_ms", "{:.0f}"),
    ("send p99", "send_lag_p99_ms", "{:.1f}"),
    *HOST_COLUMNS,
]
TTS_COLUMNS = [
    *SERVER_COLUMNS,
    ("replies", "replies", "{}"),
    ("failed", "failed_replies", "{}"),
    ("first p50", "first_audio_p50_ms", "{:.0f}"),
    ("first p95", "first_audio_p95_ms", "{:.0f}"),
    ("first max", "first_audio_max_ms", "{:.0f}"),
    ("eng first p50", "engine_first_audio_p50_ms", "{:.0f}"),
    ("1st full p50", "first_full_steps_p50", "{:.1f}"),
    ("1st pre p50", "first_pre_audio_steps_p50", "{:.1f}"),
    ("1st full p95", "first_full_steps_p95", "{:.1f}"),
    ("young full", "young_batch_full", "{:.0f}"),
    ("young wait p99", "young_wait_p99_ms", "{:.0f}"),
    ("young %", "steps_young_batch_pct", "{:.0f}"),
    ("pre %", "steps_pre_audio_pct", "{:.0f}"),
    ("full due %", "steps_full_first_audio_due_pct", "{:.0f}"),
    ("full lead %", "steps_full_lead_short_pct", "{:.0f}"),
    ("step rows", "step_rows", "{:.0f}"),
    ("step span", "step_span", "{:.0f}"),
    ("eng first p95", "engine_first_audio_p95_ms", "{:.0f}"),
    ("p95 @audio", "first_audio_by_audio_p95_ms", "{:.0f}"),
    ("after text p50", "engine_after_text_p50_ms", "{:.0f}"),
    ("after text p95", "engine_after_text_p95_ms", "{:.0f}"),
    ("stalls", "stalls", "{}"),
    ("stalled ms", "stalled_ms_total", "{:.0f}"),
    ("audio s", "audio_s", "{:.0f}"),
    *HOST_COLUMNS,
]


def print_table(points: list[dict[str, Any]], route: str) -> None:
    columns = ASR_COLUMNS if route == "asr" else TTS_COLUMNS
    widths = [max(len(name), 8) for name, _, _ in columns]
    print(" ".join(f"{name:>{w}}" for (name, _, _), w in zip(columns, widths)))
    for p in points:
        print(" ".join(f"{fmt.format(p[key]):>{w}}" for (_, key, fmt), w in zip(columns, widths)))
    for p in points:
        if p["first_error"]:
            print(f"N={p['clients']}: first error: {p['first_error']}")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    points = []
    for clients in args.clients:
        for workers in args.workers:
            point = await run_point(args, workers, clients)
            points.append(point)
            print(json.dumps(point), file=sys.stderr, flush=True)
    print(f"{args.route} {args.shape} on {args.device_name}; ms; window {args.duration - args.warmup:.0f} s per N")
    print_table(points, args.route)
    return {
        "benchmark": "bench_kyutai_served",
        "route": args.route,
        "shape": args.shape,
        "device": args.device_name,
        "kv_cache": args.kv_cache,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "marker_every": args.marker_every,
        "words_per_s": args.words_per_s,
        "client_procs": args.client_procs,
        "server_threads": args.server_threads,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_end": os.getloadavg(),
        },
        "points": points,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--route", choices=["asr", "tts"], required=True)
    parser.add_argument("--shape", default="tiny", help="asr: tiny, stt-1b, stt-2.6b, whisper; tts: tiny, tts-1.6b")
    parser.add_argument("--clients", type=int, nargs="+", default=[2])
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="front-end workers (1: one process)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of paced load per N")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds excluded from the statistics")
    parser.add_argument("--client-procs", type=int, default=1, help="load generator processes")
    parser.add_argument("--marker-every", type=int, default=5, help="asr: a Marker after every K-th frame")
    parser.add_argument("--words-per-s", type=float, default=15.0, help="tts: text rate (an LLM's speed)")
    parser.add_argument(
        "--think-s", type=float, default=0.0, help="tts: pause between a reply's end and the next (0: back to back)"
    )
    parser.add_argument(
        "--kv-cache", choices=["ring", "paged_int8", "paged_int4"], default="ring", help="asr: stt_engine.kv_cache"
    )
    parser.add_argument(
        "--open-at-start",
        action="store_true",
        help="asr: each client connects when it starts and sends from Ready on (the silence prefix's "
        "prefill then runs while its audio arrives)",
    )
    parser.add_argument(
        "--no-drain", action="store_true", help="asr: stt_engine.drain_waiting_input off (the before of drain steps)"
    )
    parser.add_argument("--weights-dir", type=Path, help="where the random weights are written (kept, reused)")
    parser.add_argument(
        "--server-threads", type=int, help="OMP_NUM_THREADS of the server (torch intra-op threads); default: unset"
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument(
        "--set", nargs="*", action="extend", default=[], help="more server settings, RTSERVE_X=VALUE (repeatable)"
    )
    parser.add_argument(
        "--profile-engine",
        type=Path,
        help="py-spy the engine process over each measured window into this raw profile; prints where it went",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.duration <= args.warmup + 1:
        parser.error("--duration must exceed --warmup by more than 1 s")
    import torch

    args.cuda = args.shape not in ("tiny", "whisper") and torch.cuda.is_available()
    args.device_name = torch.cuda.get_device_name() if args.cuda else f"cpu ({os.cpu_count()} cores)"
    base = args.weights_dir or ROOT / "benchmarks" / "results" / "weights"
    args.folder = base / f"{args.route}-{args.shape}"
    args.delay_frames = 0
    if args.route == "asr" and args.shape != "whisper":
        from rtserve.engines.kyutai_stt.settings import SttSettings
        from rtserve.engines.moshi.lm_config import LMConfig

        stt = write_stt_weights(args.folder, args.shape)
        config = LMConfig.from_dict(json.loads((args.folder / "config.json").read_text()))
        args.delay_frames = SttSettings.from_config(stt, RATE / FRAME, config.max_delay).delay_frames
    elif args.route == "tts":
        args.voices = write_tts_weights(args.folder, args.shape)
    result = asyncio.run(main_async(args))
    path = args.json or ROOT / "benchmarks" / "results" / f"bench_kyutai_served_{args.route}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
