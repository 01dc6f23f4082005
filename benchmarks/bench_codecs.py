"""CPU cost of the codec layer: milliseconds of CPU per second of audio (lower is better).

Each case streams AUDIO_SECONDS of a speech-like signal through the codec in 20 ms chunks,
as a live session would, timed with ``time.process_time``; the table quotes the median of
RUNS runs. Run: ``.venv/bin/python benchmarks/bench_codecs.py``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from rtserve.codecs import g711
from rtserve.codecs.g711 import G711Law
from rtserve.codecs.ogg import OggPageReader, build_page
from rtserve.codecs.oggopus import OggOpusReader, OggOpusWriter
from rtserve.codecs.opus import OpusDecoder, OpusEncoder
from rtserve.codecs.pcm import b64_to_pcm16, float_to_pcm16, pcm16_to_b64, pcm16_to_float
from rtserve.codecs.resample import StreamResampler

AUDIO_SECONDS = 10.0
RUNS = 7
CHUNK_MS = 20
RESULTS = Path(__file__).resolve().parent / "results" / "bench_codecs.json"
# What ``chunks`` cuts: float samples, or encoded bytes.
Chunked = TypeVar("Chunked", npt.NDArray[np.float32], bytes)


def speech_like(rate: int, seconds: float) -> npt.NDArray[np.float32]:
    """Gliding harmonics under a syllable-rate envelope plus a little noise."""
    t = np.arange(int(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(140 + 30 * np.sin(2 * np.pi * 1.3 * t)) / rate
    x = sum((0.6 / k) * np.sin(k * phase) for k in range(1, 20) if k * 170 < 0.45 * rate)
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t) ** 2)
    x = x + 0.01 * np.random.default_rng(0).standard_normal(len(t))
    scaled: npt.NDArray[np.float64] = 0.3 * x / np.max(np.abs(x))
    return scaled.astype(np.float32)


def chunks(data: Chunked, rate: int, item_bytes: int = 1) -> list[Chunked]:
    step = rate * CHUNK_MS // 1000 * item_bytes
    return [data[i : i + step] for i in range(0, len(data), step)]


def measure(setup: Callable[[], Callable[[], object]]) -> list[float]:
    """CPU ms per audio second for RUNS runs; ``setup`` builds fresh state outside the timing."""
    timings = []
    for _ in range(RUNS):
        work = setup()
        start = time.process_time()
        work()
        timings.append((time.process_time() - start) * 1000.0 / AUDIO_SECONDS)
    return timings


def opus_encode(rate: int, frame_ms: int, complexity: int = 10) -> Callable[[], object]:
    pieces = chunks(speech_like(rate, AUDIO_SECONDS), rate)
    encoder = OpusEncoder(rate, frame_ms, complexity=complexity)
    return lambda: [encoder.encode(p) for p in pieces]


def _packets(rate: int, frame_ms: int) -> list[bytes]:
    encoder = OpusEncoder(rate, frame_ms)
    return encoder.encode(speech_like(rate, AUDIO_SECONDS)) + encoder.finish()


def opus_decode(rate: int, frame_ms: int) -> Callable[[], Callable[[], object]]:
    packets = _packets(rate, frame_ms)

    def setup() -> Callable[[], object]:
        decoder = OpusDecoder(rate)
        return lambda: ([decoder.decode(p) for p in packets], decoder.flush())

    return setup


def resample_stream(in_rate: int, out_rate: int) -> Callable[[], Callable[[], object]]:
    pieces = chunks(speech_like(in_rate, AUDIO_SECONDS), in_rate)

    def setup() -> Callable[[], object]:
        resampler = StreamResampler(in_rate, out_rate)
        return lambda: ([resampler.process(p) for p in pieces], resampler.flush())

    return setup


def ogg_opus_write(rate: int, frame_ms: int) -> Callable[[], Callable[[], object]]:
    pieces = chunks(speech_like(rate, AUDIO_SECONDS), rate)

    def setup() -> Callable[[], object]:
        writer = OggOpusWriter(rate, frame_ms)
        return lambda: ([writer.write(p) for p in pieces], writer.close())

    return setup


def _ogg_messages(rate: int, frame_ms: int) -> list[bytes]:
    writer = OggOpusWriter(rate, frame_ms)
    return [writer.write(p) for p in chunks(speech_like(rate, AUDIO_SECONDS), rate)] + [writer.close()]


def ogg_opus_read(rate: int, frame_ms: int) -> Callable[[], Callable[[], object]]:
    messages = _ogg_messages(rate, frame_ms)

    def setup() -> Callable[[], object]:
        reader = OggOpusReader(rate)
        return lambda: ([reader.feed(m) for m in messages], reader.flush())

    return setup


def ogg_framing_only(rate: int, frame_ms: int) -> Callable[[], Callable[[], object]]:
    """Page build + parse + packet split for pre-encoded packets: the Ogg layer alone."""
    packets = _packets(rate, frame_ms)

    def setup() -> Callable[[], object]:
        reader = OggPageReader()

        def work() -> None:
            for sequence, packet in enumerate(packets):
                page = build_page(serial=1, sequence=sequence, granule=sequence * 960, packets=[packet])
                for parsed in reader.feed(page):
                    parsed.segments()

        return work

    return setup


def g711_encode(law: G711Law) -> Callable[[], object]:
    pieces = chunks(speech_like(8000, AUDIO_SECONDS), 8000)
    return lambda: [g711.encode(law, p) for p in pieces]


def g711_decode(law: G711Law) -> Callable[[], object]:
    pieces = chunks(g711.encode(law, speech_like(8000, AUDIO_SECONDS)), 8000)
    return lambda: [g711.decode(law, p) for p in pieces]


def pcm16_b64_round_trip() -> Callable[[], object]:
    pieces = chunks(speech_like(24000, AUDIO_SECONDS), 24000)
    return lambda: [pcm16_to_float(b64_to_pcm16(pcm16_to_b64(float_to_pcm16(p)))) for p in pieces]


CASES: list[tuple[str, Callable[[], Callable[[], object]]]] = [
    ("opus encode 24k/20ms", lambda: opus_encode(24000, 20)),
    ("opus encode 24k/20ms complexity 5", lambda: opus_encode(24000, 20, complexity=5)),
    ("opus encode 24k/80ms", lambda: opus_encode(24000, 80)),
    ("opus encode 48k/20ms", lambda: opus_encode(48000, 20)),
    ("opus decode 24k/20ms (incl. 48k->24k)", opus_decode(24000, 20)),
    ("opus decode 48k/20ms", opus_decode(48000, 20)),
    ("resample 48k->24k", resample_stream(48000, 24000)),
    ("resample 24k->48k", resample_stream(24000, 48000)),
    ("resample 24k->16k", resample_stream(24000, 16000)),
    ("resample 8k->24k", resample_stream(8000, 24000)),
    ("ogg-opus write 24k/20ms", ogg_opus_write(24000, 20)),
    ("ogg-opus read 24k/20ms", ogg_opus_read(24000, 20)),
    ("ogg-opus write 48k/20ms", ogg_opus_write(48000, 20)),
    ("ogg-opus read 48k/20ms", ogg_opus_read(48000, 20)),
    ("ogg framing only (write+read) 20ms pages", ogg_framing_only(24000, 20)),
    ("g711 ulaw encode", lambda: g711_encode("ulaw")),
    ("g711 ulaw decode", lambda: g711_decode("ulaw")),
    ("g711 alaw encode", lambda: g711_encode("alaw")),
    ("g711 alaw decode", lambda: g711_decode("alaw")),
    ("pcm16+base64 round trip 24k", lambda: pcm16_b64_round_trip()),
]


def main() -> None:
    rows: list[dict[str, Any]] = []
    for name, setup in CASES:
        timings = measure(setup)
        median = statistics.median(timings)
        rows.append(
            {
                "case": name,
                "cpu_ms_per_audio_s_median": round(median, 4),
                "min": round(min(timings), 4),
                "max": round(max(timings), 4),
                "streams_per_core": round(1000.0 / median) if median > 0 else None,
            }
        )
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}}  {'CPU ms / audio s (median)':>26}  {'min':>8}  {'max':>8}  {'streams/core':>12}")
    for r in rows:
        print(
            f"{r['case']:<{width}}  {r['cpu_ms_per_audio_s_median']:>26.3f}  {r['min']:>8.3f}  {r['max']:>8.3f}  "
            f"{r['streams_per_core'] or '-':>12}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "bench_codecs",
                "unit": "CPU milliseconds per second of audio (time.process_time), median of runs",
                "audio_seconds": AUDIO_SECONDS,
                "runs": RUNS,
                "chunk_ms": CHUNK_MS,
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine(),
                },
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
