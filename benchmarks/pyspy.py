"""py-spy over a server process during a benchmark's measured window, and what the samples say:
the share of samples per thread (by name: ``MainThread`` is the event loop, ``<engine>-engine``
a lockstep engine thread, ``rtserve-vad-0`` a cascade lane), per function anywhere on a thread's
stack and per leaf function."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RATE = 200  # samples a second


def start(pid: int, seconds: float, raw: Path, *, gil: bool = False) -> subprocess.Popen[bytes] | None:
    """Record ``pid`` (threads named, ``RATE`` Hz, without pausing it) into ``raw``; None without
    py-spy. ``gil``: only the thread holding the GIL at each sample, so the samples over ``RATE``
    are the seconds the GIL was held."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("py-spy not found: no profile", file=sys.stderr)
        return None
    raw.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", str(RATE),
         "--format", "raw", "--threads", "--nonblocking", *(["--gil"] if gil else []), "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def finish(profiler: subprocess.Popen[bytes], raw: Path) -> dict[str, Any] | None:
    """Wait for ``start``'s recording and summarize it."""
    profiler.wait(60)
    return summarize(raw.read_text()) if raw.exists() else None


def stop(profiler: subprocess.Popen[bytes]) -> None:
    """End ``start``'s recording now: py-spy writes what it has on an interrupt."""
    profiler.send_signal(signal.SIGINT)
    profiler.wait(60)


def report(profiler: subprocess.Popen[bytes] | None, raw: Path, title: str) -> dict[str, Any] | None:
    """``finish`` a recording (if one was started) and print it."""
    profile = finish(profiler, raw) if profiler is not None else None
    if profile is not None:
        print_profile(title, profile)
    return profile


def record(pid: int, seconds: float, raw: Path) -> dict[str, Any] | None:
    """``start`` then ``finish``: blocks for ``seconds``."""
    profiler = start(pid, seconds, raw)
    return finish(profiler, raw) if profiler is not None else None


def summarize(text: str) -> dict[str, Any]:
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = _thread(frames[0])
        total += count
        threads[thread] += count
        leaf[f"{thread}: {_short(frames[-1])}"] += count
        for name in {_short(f) for f in frames[1:]}:
            inclusive[f"{thread}: {name}"] += count
    return {
        "samples": total,
        "threads": {k: v / max(1, total) for k, v in threads.most_common()},
        "leaf": [(k, v / max(1, total)) for k, v in leaf.most_common(25)],
        "inclusive": [(k, v / max(1, total)) for k, v in inclusive.most_common(40)],
    }


def _thread(frame: str) -> str:
    """``thread (5556): rtserve-vad-0`` -> ``rtserve-vad-0``; unnamed threads keep their id."""
    _, _, name = frame.partition("): ")
    return re.sub(r"^Thread-\d+.*", "thread", name) if name else frame


def _short(frame: str) -> str:
    """``step (rtserve/engines/moshi/frame_model.py:123)`` -> ``step (frame_model.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').split(':')[0]).name})" if where else name


def print_profile(title: str, profile: dict[str, Any]) -> None:
    """The functions the most samples were in (anywhere on the stack), and the leaves."""
    threads = ", ".join(f"{name} {100 * share:.0f}%" for name, share in profile["threads"].items())
    print(f"\nprofile {title}: {profile['samples']} samples ({threads}); % of samples, inclusive:")
    for name, share in profile["inclusive"][:30]:
        print(f"  {100 * share:5.1f}%  {name}")
    print("leaves (self time):")
    for name, share in profile["leaf"][:15]:
        print(f"  {100 * share:5.1f}%  {name}")
