"""Codec cost of one Moshi ``/api/chat`` session, per Ogg-Opus implementation (issue 13).

Per session-second the server encodes 12.5 agent frames of 80 ms (24 kHz mono, one Ogg page
each, at the server's ``config.moshi`` bitrate/application/complexity) and decodes 12.5 of
the client's 80 ms Ogg pages. Implementations compared:

* ``pyav+ogg.py``: today's code (``rtserve.codecs.oggopus`` over PyAV's libopus; the decoder
  runs at 48 kHz and soxr resamples to 24 kHz).
* ``opuslib+ogg.py``: the same hand-written Ogg layer over ``opuslib`` (ctypes over the
  system ``libopus0``; decodes natively at 24 kHz). Needs ``pip install opuslib==3.0.1``;
  the row is skipped when it is missing.
* ``sphn``: Kyutai's Rust Ogg-Opus streams (``OpusStreamWriter``/``OpusStreamReader``). Its
  writer takes no bitrate/application/complexity (fixed VoIP/SILK settings), so its encode
  row does not run the server's settings.

The client stream every reader decodes is what Moshi's own Python client sends: sphn's
``OpusStreamWriter`` pages, one per 80 ms, one page per message. (sphn writes a pre-skip of
3840 but its real delay is ~150 samples at 24 kHz, so readers that honour pre-skip, ours,
show a negative lag on sphn streams; sphn's reader ignores pre-skip, so it lags ours.)

**CPU cost**: ``time.thread_time`` around each loop (a single thread, so other engineers'
processes do not count), RUNS runs with the implementations interleaved, median quoted.

**Share outside the GIL** (the "probe" method): the codec loop runs in thread A while
thread B spins a pure-Python counter until A is done. B only burns CPU while it holds the
GIL, so any moment where A and B both run on a CPU is a moment where A runs without the
GIL. Over wall time W with thread CPU times C_A and C_B, the overlap C_A + C_B - W is the
time A spent off the GIL, and off-GIL share = (C_A + C_B - W) / C_A. It needs a second free
core; cores taken by other processes only lower the overlap, never raise it, so the table
quotes the largest of PROBE_RUNS probes (the least disturbed), and GIL hand-offs cost a little.
Calibration rows run the probe on pure Python (expect ~0 %)
and on ``hashlib.sha256`` of 16 MiB buffers (releases the GIL; expect ~100 %) so a reader can
see the method's floor and ceiling on the machine the table came from. Only GIL releases
that last longer than the wake-up of another thread count: libopus releases the GIL for
~0.1-0.2 ms per 80 ms frame (both PyAV, around ``avcodec_send_frame``/``send_packet``, and
ctypes do release it), and on a loaded 2-core machine a woken thread rarely gets a CPU in
that time, so the probe reads ~0 % for every codec here. Spreading codec work means
processes (``--workers``), not threads.

**Sessions per core** = 1000 / (encode + decode CPU ms per session-second). **Sessions per
GIL** = 1000 / (GIL-held ms per session-second): the ceiling of one front-end process
however many cores it has (with ``--workers N`` each worker has its own GIL).

An interop matrix checks every writer's stream against every reader (best-lag correlation
with the input) so the comparison is between streams that really decode.

Run: ``PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_opus_codecs.py``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import sphn
from bench_codecs import speech_like  # benchmarks/ is on sys.path: scripts run from there

from rtserve.codecs.ogg import OggPage
from rtserve.codecs.oggopus import OggOpusReader, OggOpusWriter
from rtserve.config import MoshiConfig

try:
    import opuslib
except Exception:  # noqa: BLE001 - not installed, or libopus0 missing (opuslib raises a bare Exception)
    opuslib = None

RATE = 24000
FRAME_MS = 80
FRAME = RATE * FRAME_MS // 1000
AUDIO_SECONDS = 10.0
RUNS = 7
PROBE_RUNS = 5
PROBE_REPEAT = 4  # sessions run back to back per probe, so the codec thread's CPU time dwarfs hand-off noise
RESULTS = Path(__file__).resolve().parent / "results" / "bench_opus_codecs.json"
SETTINGS = MoshiConfig()

Writer = Callable[[npt.NDArray[np.float32]], bytes]
Reader = Callable[[bytes], npt.NDArray[np.float32]]


# --- opuslib behind the hand-written Ogg layer -------------------------------------------


class _OpuslibEncoder:
    """Drop-in for ``rtserve.codecs.opus.OpusEncoder`` (whole frames only: the bench feeds them)."""

    _APPLICATIONS: ClassVar[dict[str, str]] = {"audio": "audio", "voip": "voip", "lowdelay": "restricted_lowdelay"}

    def __init__(self, rate: int, frame_ms: int, bitrate: int, application: str, complexity: int) -> None:
        self._enc = opuslib.Encoder(rate, 1, self._APPLICATIONS[application])
        self._enc.bitrate = bitrate
        self._enc.complexity = complexity
        self.sample_rate = rate
        self.frame_samples = rate * frame_ms // 1000
        self.pre_skip_48k = self._enc.lookahead * 48000 // rate
        self.frame_duration_48k = self.frame_samples * 48000 // rate

    def encode(self, samples: npt.NDArray[np.float32]) -> list[bytes]:
        n = self.frame_samples
        return [
            self._enc.encode_float(np.ascontiguousarray(samples[i : i + n], np.float32).tobytes(), n)
            for i in range(0, len(samples) - n + 1, n)
        ]

    def finish(self) -> list[bytes]:
        return self.encode(np.zeros(self.frame_samples, np.float32))


class _OpuslibDecoder:
    def __init__(self, rate: int, channels: int) -> None:
        self._dec = opuslib.Decoder(rate, channels)
        self._channels = channels
        self._max = rate * 120 // 1000

    def decode(self, packet: bytes) -> npt.NDArray[np.float32]:
        pcm = np.frombuffer(self._dec.decode_float(packet, self._max), np.float32)
        return pcm if self._channels == 1 else pcm.reshape(-1, 2).mean(axis=1)

    def flush(self) -> npt.NDArray[np.float32]:
        return np.zeros(0, np.float32)


class _OpuslibOggReader(OggOpusReader):
    def _start_stream(self, page: OggPage) -> None:
        super()._start_stream(page)
        assert self._head is not None
        # A duck-typed stand-in for the OpusDecoder the attribute is declared as.
        self._decoder = _OpuslibDecoder(self.sample_rate, self._head.channels)  # type: ignore[assignment]


# --- the implementations -----------------------------------------------------------------


def pyav_writer() -> Writer:
    return OggOpusWriter(
        RATE,
        FRAME_MS,
        bitrate=SETTINGS.opus_bitrate,
        application=SETTINGS.opus_application,
        complexity=SETTINGS.opus_complexity,
    ).write


def pyav_reader() -> Reader:
    return OggOpusReader(RATE).feed


def opuslib_writer() -> Writer:
    writer = OggOpusWriter(RATE, FRAME_MS)
    # A duck-typed stand-in for the OpusEncoder the attribute is declared as.
    writer._encoder = _OpuslibEncoder(  # type: ignore[assignment]
        RATE,
        FRAME_MS,
        SETTINGS.opus_bitrate,
        SETTINGS.opus_application,
        SETTINGS.opus_complexity,
    )
    return writer.write


def opuslib_reader() -> Reader:
    return _OpuslibOggReader(RATE).feed


def sphn_writer() -> Writer:
    write: Writer = sphn.OpusStreamWriter(RATE).append_pcm
    return write


def sphn_reader() -> Reader:
    reader = sphn.OpusStreamReader(RATE)
    return lambda data: reader.append_bytes(data)


@dataclass(frozen=True)
class Impl:
    name: str
    writer: Callable[[], Writer]
    reader: Callable[[], Reader]
    note: str


IMPLS = [Impl("pyav+ogg.py", pyav_writer, pyav_reader, "today")]
if opuslib is not None:
    IMPLS.append(Impl("opuslib+ogg.py", opuslib_writer, opuslib_reader, "ctypes over libopus0"))
IMPLS.append(Impl("sphn", sphn_writer, sphn_reader, "encoder: fixed VoIP settings, no bitrate/complexity knobs"))


# --- workloads ---------------------------------------------------------------------------

SIGNAL = speech_like(RATE, AUDIO_SECONDS)
FRAMES = [SIGNAL[i : i + FRAME] for i in range(0, len(SIGNAL) - FRAME + 1, FRAME)]


def client_messages() -> list[bytes]:
    write = sphn_writer()
    return [write(f) for f in FRAMES]


CLIENT = client_messages()


def encode_work(impl: Impl, repeat: int = 1) -> Callable[[], object]:
    writers = [impl.writer() for _ in range(repeat)]
    return lambda: [write(f) for write in writers for f in FRAMES]


def decode_work(impl: Impl, repeat: int = 1) -> Callable[[], object]:
    readers = [impl.reader() for _ in range(repeat)]
    return lambda: [feed(m) for feed in readers for m in CLIENT]


def cpu_ms_per_second(work: Callable[[], object]) -> float:
    start = time.thread_time()
    work()
    return (time.thread_time() - start) * 1000.0 / AUDIO_SECONDS


def off_gil_share(work: Callable[[], object]) -> float:
    """Probe method (module doc): overlap of a pure-Python spinner with the work, over the work's CPU."""
    done = threading.Event()
    started = threading.Event()
    cpu: dict[str, float] = {}

    def spinner() -> None:
        start = time.thread_time()
        started.set()
        n = 0
        while not done.is_set():
            n += 1
        cpu["b"] = time.thread_time() - start

    def codec() -> None:
        started.wait()
        start = time.thread_time()
        work()
        cpu["a"] = time.thread_time() - start
        done.set()

    threads = [threading.Thread(target=spinner), threading.Thread(target=codec)]
    wall_start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall_start
    return (cpu["a"] + cpu["b"] - wall) / cpu["a"]  # raw: noise can push it a little past [0, 1]


def calibration() -> dict[str, float]:
    blob = np.random.default_rng(0).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes()

    def pure_python() -> None:
        total = 0
        for i in range(3_000_000):
            total += i

    def sha256_work() -> None:  # one GIL release per 16 MiB call
        for _ in range(8):
            hashlib.sha256(blob).digest()

    return {
        "pure_python": round(max(off_gil_share(pure_python) for _ in range(PROBE_RUNS)), 3),
        "sha256": round(max(off_gil_share(sha256_work) for _ in range(PROBE_RUNS)), 3),
    }


# --- interop -----------------------------------------------------------------------------


def _best_corr(x: npt.NDArray[np.float32], y: npt.NDArray[np.float32], max_lag: int = 2400) -> tuple[int, float]:
    """Lag L (|L| < max_lag) where ``y[L + i]`` best matches ``x[i]``, and the correlation there."""
    size = 1 << int(np.ceil(np.log2(len(x) + len(y))))
    corr = np.fft.irfft(np.fft.rfft(y, size) * np.conj(np.fft.rfft(x, size)), size)
    lags = np.r_[np.arange(0, max_lag), np.arange(-max_lag + 1, 0)]
    lag = int(lags[np.argmax(np.r_[corr[:max_lag], corr[size - max_lag + 1 :]])])
    a, b = (x, y[lag:]) if lag >= 0 else (x[-lag:], y)
    n = min(len(a), len(b))
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    return lag, float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b) + 1e-12))


def interop() -> list[dict[str, object]]:
    rows = []
    x = SIGNAL[: RATE * 2]
    frames = [x[i : i + FRAME] for i in range(0, len(x), FRAME)]
    for w in IMPLS:
        write = w.writer()
        stream = [write(f) for f in frames]
        for r in IMPLS:
            feed = r.reader()
            y = np.concatenate([np.asarray(feed(m), np.float32).reshape(-1) for m in stream])
            lag, corr = _best_corr(x, y)
            rows.append(
                {
                    "writer": w.name,
                    "reader": r.name,
                    "samples": len(y),
                    "lag": lag,
                    "correlation": round(corr, 3),
                    "ok": corr > 0.8,
                }
            )
    return rows


# --- main --------------------------------------------------------------------------------


def main() -> None:
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(RUNS):  # interleaved, so load changes hit every implementation alike
        for impl in IMPLS:
            for kind, make in (("encode", encode_work), ("decode", decode_work)):
                cpu.setdefault((impl.name, kind), []).append(cpu_ms_per_second(make(impl)))
    gil: dict[tuple[str, str], list[float]] = {}
    for _ in range(PROBE_RUNS):
        for impl in IMPLS:
            for kind, make in (("encode", encode_work), ("decode", decode_work)):
                gil.setdefault((impl.name, kind), []).append(off_gil_share(make(impl, PROBE_REPEAT)))
    calib = calibration()
    probe_valid = calib["sha256"] >= 0.8  # otherwise no second core was free: the probe says nothing
    checks = interop()

    rows: list[dict[str, Any]] = []
    for impl in IMPLS:
        enc, dec = (statistics.median(cpu[(impl.name, k)]) for k in ("encode", "decode"))
        f_enc, f_dec = (min(1.0, max(0.0, *gil[(impl.name, k)])) if probe_valid else None for k in ("encode", "decode"))
        held = enc * (1 - f_enc) + dec * (1 - f_dec) if f_enc is not None and f_dec is not None else None
        rows.append(
            {
                "impl": impl.name,
                "note": impl.note,
                "encode_cpu_ms_per_s": round(enc, 3),
                "decode_cpu_ms_per_s": round(dec, 3),
                "encode_cpu_ms_per_s_runs": [round(v, 3) for v in cpu[(impl.name, "encode")]],
                "decode_cpu_ms_per_s_runs": [round(v, 3) for v in cpu[(impl.name, "decode")]],
                "total_cpu_ms_per_s": round(enc + dec, 3),
                "encode_off_gil": None if f_enc is None else round(f_enc, 3),
                "decode_off_gil": None if f_dec is None else round(f_dec, 3),
                "gil_held_ms_per_s": None if held is None else round(held, 3),
                "sessions_per_core": round(1000.0 / (enc + dec), 1),
                "sessions_per_gil": round(1000.0 / held, 1) if held else None,
            }
        )

    head = (
        f"{'implementation':<16} {'enc ms/s':>9} {'dec ms/s':>9} {'total':>7} {'enc off-GIL':>11} "
        f"{'dec off-GIL':>11} {'GIL ms/s':>9} {'sess/core':>10} {'sess/GIL':>9}"
    )
    print(
        f"/api/chat codec work per session-second: 24 kHz mono, 80 ms pages, bitrate {SETTINGS.opus_bitrate}, "
        f"{SETTINGS.opus_application}, complexity {SETTINGS.opus_complexity}; CPU: median of {RUNS} runs, "
        f"off-GIL: best of {PROBE_RUNS} probes"
    )
    print(head)

    def cell(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    for r in rows:
        print(
            f"{r['impl']:<16} {r['encode_cpu_ms_per_s']:>9.2f} {r['decode_cpu_ms_per_s']:>9.2f} "
            f"{r['total_cpu_ms_per_s']:>7.2f} {cell(r['encode_off_gil'], '.0%'):>11} "
            f"{cell(r['decode_off_gil'], '.0%'):>11} {cell(r['gil_held_ms_per_s'], '.2f'):>9} "
            f"{r['sessions_per_core']:>10.1f} {cell(r['sessions_per_gil'], '.1f'):>9}"
        )
    if opuslib is None:
        print("opuslib: not installed (pip install opuslib==3.0.1, needs libopus0): row skipped")
    print(
        f"probe calibration (off-GIL share): pure Python {calib['pure_python']:.0%}, "
        f"hashlib.sha256 {calib['sha256']:.0%}"
        + ("" if probe_valid else " -> no free second core during the probe: off-GIL shares not measurable on this run")
    )
    print("interop (writer -> reader: best-lag correlation with the input):")
    for c in checks:
        print(
            f"  {c['writer']:<16} -> {c['reader']:<16} corr {c['correlation']:.3f} lag {c['lag']:>4} "
            f"{'ok' if c['ok'] else 'FAIL'}"
        )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "bench_opus_codecs",
                "unit": "CPU milliseconds (time.thread_time) per second of one /api/chat session, median of runs",
                "workload": {
                    "sample_rate": RATE,
                    "frame_ms": FRAME_MS,
                    "audio_seconds": AUDIO_SECONDS,
                    "bitrate": SETTINGS.opus_bitrate,
                    "application": SETTINGS.opus_application,
                    "complexity": SETTINGS.opus_complexity,
                    "client_stream": "sphn.OpusStreamWriter pages",
                },
                "runs": RUNS,
                "probe_runs": PROBE_RUNS,
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine(),
                    "cpus": len(__import__("os").sched_getaffinity(0)),
                },
                "gil_method": "probe: off-GIL share = (C_codec + C_spinner - wall) / C_codec, best of probe runs",
                "off_gil_runs": {
                    f"{name} {kind}": [round(v, 3) for v in values] for (name, kind), values in gil.items()
                },
                "calibration_off_gil": calib,
                "results": rows,
                "interop": checks,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {RESULTS}")
    if not all(c["ok"] for c in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
