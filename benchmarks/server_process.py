"""``rtserve serve`` in a child process for the load benchmarks, configured through
``RTSERVE_*`` variables, so clients and server never share one interpreter. With
``workers`` > 1 that is a supervisor, an engine process and the workers: CPU time is summed
over all of them, and ``scrape`` folds the per-worker metrics into one value per series."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

import rtserve

ROOT = Path(__file__).resolve().parents[1]
# The server runs the rtserve this process imported, which may be another tree on PYTHONPATH
# (a before/after comparison): with ``-m`` the child would put its working directory, ROOT,
# ahead of PYTHONPATH and import ROOT's copy. PYTHONSAFEPATH leaves the working directory out.
RTSERVE_TREE = Path(rtserve.__file__).resolve().parents[1]


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a server child: this one, ``env`` on top, importing ``RTSERVE_TREE``."""
    path = os.pathsep.join(p for p in (str(RTSERVE_TREE), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": path, **env}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class NotReady(Exception):
    """A readiness probe's "not yet", saying what it saw: reported if the wait runs out."""


class ServerProcess:
    def __init__(
        self,
        env: dict[str, str],
        *,
        engine: str = "loopback",
        name: str = "bench",
        workers: int = 1,
        config: Path | None = None,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # Open for the server's whole life (closed in stop()): no context manager fits.
        self._log = tempfile.NamedTemporaryFile(prefix=f"{name}_server_", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtserve.cli",
                "serve",
                "--engine",
                engine,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--workers",
                str(workers),
                *(["--config", str(config)] if config else []),
            ],
            cwd=ROOT,
            env=server_env(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    async def wait_ready(
        self,
        http: aiohttp.ClientSession,
        timeout_s: float = 60.0,
        probe: Callable[[aiohttp.ClientSession], Awaitable[bool]] | None = None,
    ) -> None:
        """Until ``probe`` (default: ``/health`` answers 200) succeeds. If it never does, the error
        says what the last probe saw and what ``/health`` says (a server logging at warning level
        may have written nothing while its engine still loads)."""
        probe = probe or self._healthy
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{await self.log_tail()}")
            try:
                if await probe(http):
                    return
                last = "not ready"
            except NotReady as exc:
                last = str(exc)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
        raise RuntimeError(
            f"server did not become ready in {timeout_s:.0f} s (last probe: {last}; /health: "
            f"{await self.health_text(http)}):\n{await self.log_tail()}"
        )

    async def health_text(self, http: aiohttp.ClientSession) -> str:
        """``/health``'s status and body, or why it did not answer."""
        try:
            async with http.get(self.base + "/health", timeout=aiohttp.ClientTimeout(total=5)) as response:
                return f"{response.status} {(await response.text())[:1000]}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return repr(exc)

    async def log_tail(self, chars: int = 3000) -> str:
        return (await asyncio.to_thread(Path(self._log.name).read_text))[-chars:]

    async def _healthy(self, http: aiohttp.ClientSession) -> bool:
        async with http.get(self.base + "/health") as response:
            if response.status == 503 and (await response.json()).get("status") == "failed":
                # An engine that failed to load stays failed: waiting out the timeout only hides why.
                raise RuntimeError(f"an engine failed to start:\n{await self.log_tail()}")
            return response.status == 200

    def pids(self) -> list[int]:
        """The server and every process under it (supervisor, engine process, workers)."""
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        tree = {self.proc.pid}
        while True:
            grown = tree | {pid for pid, parent in parents.items() if parent in tree}
            if grown == tree:
                return sorted(tree)
            tree = grown

    def engine_pid(self) -> int:
        """The process that runs the engines: the supervisor's first child (started before the
        workers), or the server itself with one worker."""
        children = []
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid and b"spawn_main" in cmdline:
                children.append((int(fields[19]), pid))  # start time, in clock ticks since boot
        return min(children)[1] if children else self.proc.pid

    def cpu_by_process(self) -> dict[int, float]:
        """CPU seconds of the server and each process under it, by pid."""
        tick = os.sysconf("SC_CLK_TCK")
        cpu = {}
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
        return cpu

    def busiest_pct(self, before: dict[int, float], after: dict[int, float], seconds: float) -> float:
        """The busiest single process between two ``cpu_by_process`` readings, in % of one core."""
        return max((100.0 * (t - before.get(pid, 0.0)) / seconds for pid, t in after.items()), default=0.0)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        os.unlink(self._log.name)


_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([-+0-9.e]+|[+-]Inf|NaN)$")
_WORKER_LABEL = re.compile(r',?worker="[^"]*"')


ENGINE_PROCESS = "engine process:"  # key prefix of the samples the engine's own process reported


async def scrape(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Every sample of /metrics keyed ``name{labels}``, summed over workers (``worker`` label
    dropped); the engine process's own samples (no ``worker`` label; with one process, that
    process's) also under ``ENGINE_PROCESS + key``."""
    async with http.get(base + "/metrics") as response:
        text = await response.text()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            raw_labels = match.group(2) or ""
            labels = _WORKER_LABEL.sub("", raw_labels).replace("{,", "{")
            key = match.group(1) + ("" if labels == "{}" else labels)
            samples[key] = samples.get(key, 0.0) + float(match.group(3))
            if labels == raw_labels:
                samples[ENGINE_PROCESS + key] = float(match.group(3))
    return samples


def _le(bucket: str) -> float:
    """The upper bound of one ``_bucket`` series: its ``le`` label (every bucket has one)."""
    match = re.search(r'le="([^"]+)"', bucket)
    assert match is not None
    return float(match.group(1))


def histogram_max(before: dict[str, float], after: dict[str, float], name: str, labels: str = "") -> float:
    """Upper bound of the highest bucket that gained observations between two scrapes (0: none;
    inf: past the last bound): how bad the worst one was, e.g. one stall among thousands.
    ``labels`` (``generation="2"``) picks one series of a labelled histogram."""
    prefix = name + "_bucket" + ("{" + labels + "," if labels else "")
    worst, previous = 0.0, 0.0
    for bound, count in sorted(
        (_le(key), value - before.get(key, 0.0)) for key, value in after.items() if key.startswith(prefix)
    ):
        if count > previous:
            worst = bound
        previous = count
    return worst


def histogram_quantile(
    before: dict[str, float],
    after: dict[str, float],
    name: str,
    q: float,
    label: str = "",
    *,
    engine_only: bool = False,
) -> float:
    """Quantile of the observations made between two scrapes (linear within a bucket); ``label``
    (e.g. ``phase="control"``) picks one series of a labelled histogram. The series it matches
    (one per process with workers) are summed bucket by bucket; ``engine_only``: the engine
    process's alone (the samples workers pushed carry ``worker="i"``)."""
    counts: dict[float, float] = {}
    for key, value in after.items():
        if key.startswith(name + "_bucket") and label in key and not (engine_only and _WORKER_LABEL.search(key)):
            le = re.search(r'le="([^"]+)"', key)
            if le:
                bound = float(le.group(1))
                counts[bound] = counts.get(bound, 0.0) + value - before.get(key, 0.0)
    buckets = sorted(counts.items())
    if not buckets or buckets[-1][1] <= 0:
        return float("nan")
    target = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= target:
            if bound == float("inf"):
                return lower_bound
            span = count - lower_count
            return lower_bound + (bound - lower_bound) * ((target - lower_count) / span if span else 1.0)
        lower_bound, lower_count = bound, count
    return buckets[-1][0]


def histogram_mean(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """Mean of the observations made between two scrapes (NaN with none)."""
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    return total / count if count else float("nan")


def tick_parts_p99_ms(before: dict[str, float], after: dict[str, float], family: str) -> dict[str, float]:
    """p99 of a lockstep engine's tick parts around the step (``{family}tick_phase_seconds``, e.g.
    ``rtserve_kyutai_stt_``) between two scrapes: ``control_p99_ms``, ``gather_p99_ms``, ``scatter_p99_ms``."""
    return {
        f"{phase}_p99_ms": 1e3
        * histogram_quantile(before, after, f"{family}tick_phase_seconds", 0.99, f'phase="{phase}"')
        for phase in ("control", "gather", "scatter")
    }


def full_collections(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The server's full (generation 2) garbage collections between two scrapes (each holds its
    process's GIL): how many in all processes together and in the engine process, and the p99
    pause of each."""
    label = 'generation="2"'
    counts = {
        k: v - before.get(k, 0.0)
        for k, v in after.items()
        if k.startswith("rtserve_gc_pause_seconds_count") and label in k
    }
    name = "rtserve_gc_pause_seconds"
    return {
        "gc_full_collections": sum(counts.values()),
        "gc_full_pause_p99_ms": 1e3 * histogram_quantile(before, after, name, 0.99, label),
        "engine_gc_full_collections": sum(v for k, v in counts.items() if not _WORKER_LABEL.search(k)),
        "engine_gc_full_pause_p99_ms": 1e3 * histogram_quantile(before, after, name, 0.99, label, engine_only=True),
    }
