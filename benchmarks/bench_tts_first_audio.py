"""First-audio latency of the Kyutai TTS engine, paced vs running ahead of playback (issue 33).

Builds the engine in this process on a tiny random Kyutai TTS checkpoint (the tests' writer; CPU,
float32, greedy) three times: ``tts_engine.run_ahead`` false, true without catching up
(``catch_up_lead_ms`` 0), and true with the default catch-up (a new reply's pre-audio steps go
alone while the others are ahead: docs/engines.md#pre-audio-steps), and per run opens a stream,
sends a sentence and its end at once and times: the first audio frame, and all of the speech.
Scenarios: a stream alone, and a fresh stream opened while ``--busy`` others are speaking long
texts (read as fast as they come). Medians and maxima of ``--runs``. Prints a table; writes JSON
to ``--out``. Run: ``.venv/bin/python benchmarks/bench_tts_first_audio.py``.
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
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # for tests/ helpers; appended: an rtserve tree on PYTHONPATH stays first

from rtserve.config import ServerConfig  # noqa: E402
from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine  # noqa: E402
from rtserve.engines.kyutai_tts.stream import SpeechAudio, TTSStream  # noqa: E402
from tests.engines.kyutai_tts.tiny import write_tts_checkpoint  # noqa: E402

SENTENCE = "the quick brown fox jumps over the lazy dog"
LONG = " ".join([SENTENCE] * 6)


async def speak(stream: TTSStream, text: str) -> tuple[float, float, int]:
    """(seconds to the first audio frame, seconds to the end, frames)."""
    started = time.monotonic()
    stream.send_text(text)
    stream.end()
    first, frames = None, 0
    async for event in stream.events():
        if isinstance(event, SpeechAudio):
            frames += 1
            first = first if first is not None else time.monotonic() - started
    await stream.close()
    return first or float("nan"), time.monotonic() - started, frames


async def scenario(engine: KyutaiTTSEngine, busy: int, runs: int) -> dict[str, float]:
    firsts, totals, per_frame = [], [], []
    for run in range(runs):
        background = []
        for index in range(busy):
            stream = await engine.open_stream(f"busy{run}-{index}", "alice")
            background.append(asyncio.create_task(speak(stream, LONG)))
        await asyncio.sleep(0.3 if busy else 0.0)  # the others are mid-speech
        stream = await engine.open_stream(f"fresh{run}", "alice")
        first, total, frames = await speak(stream, SENTENCE)
        firsts.append(first)
        totals.append(total)
        per_frame.append(total / max(frames, 1))
        await asyncio.gather(*background)
    return {
        "first_audio_p50_ms": 1e3 * statistics.median(firsts),
        "first_audio_max_ms": 1e3 * max(firsts),
        "speech_p50_ms": 1e3 * statistics.median(totals),
        "ms_per_frame_p50": 1e3 * statistics.median(per_frame),  # 80 when paced and keeping up
    }


# mode -> (run_ahead, catch_up_lead_ms); None: the default
MODES: dict[str, tuple[bool, float | None]] = {
    "paced": (False, None),
    "run ahead": (True, 0.0),
    "catch up": (True, None),
}


async def measure(
    weights: Path, run_ahead: bool, lead_ms: float | None, busy: int, runs: int
) -> dict[str, dict[str, float]]:
    base = ServerConfig()
    lead = {} if lead_ms is None else {"catch_up_lead_ms": lead_ms}
    config = base.model_copy(
        update={
            "tts_engine": base.tts_engine.model_copy(
                update={
                    "weights": str(weights),
                    "voices": str(weights / "voices"),
                    "max_sessions": busy + 1,
                    "temperature": 0.0,
                    "run_ahead": run_ahead,
                    **lead,
                }
            )
        }
    )
    engine = KyutaiTTSEngine(config)
    await engine.start()
    assert engine.ready, engine.failure
    try:
        return {"alone": await scenario(engine, 0, runs), f"beside {busy} busy": await scenario(engine, busy, runs)}
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_tts_first_audio.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "weights"
        write_tts_checkpoint(weights)
        results = {
            mode: asyncio.run(measure(weights, run_ahead, lead_ms, args.busy, args.runs))
            for mode, (run_ahead, lead_ms) in MODES.items()
        }
    print(
        f"{'mode':<10} {'scenario':<14} {'first audio p50 ms':>19} {'max ms':>8} {'whole speech p50 ms':>20}"
        f" {'ms/frame':>9}"
    )
    for mode, scenarios in results.items():
        for name, row in scenarios.items():
            print(
                f"{mode:<10} {name:<14} {row['first_audio_p50_ms']:>19.0f} {row['first_audio_max_ms']:>8.0f} "
                f"{row['speech_p50_ms']:>20.0f} {row['ms_per_frame_p50']:>9.0f}"
            )
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "runs": args.runs, "results": results}, indent=2))
    print(f"machine: {machine}")


if __name__ == "__main__":
    main()
