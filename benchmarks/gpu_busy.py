"""The GPU's activity over a benchmark's measured window: ``nvidia-smi``'s utilization of device 0
(the share of each sample period in which a kernel ran), sampled every 100 ms and averaged. Near
100 % the GPU is the limit; well under it while the engine falls behind, the time goes elsewhere
(the host, or waits of one engine's work on another's)."""

from __future__ import annotations

import math
import shutil
import subprocess


def start() -> subprocess.Popen[str] | None:
    """Start sampling; None where there is no ``nvidia-smi`` (a CPU host)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    return subprocess.Popen(
        [smi, "-i", "0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def finish(sampler: subprocess.Popen[str] | None) -> float:
    """The mean utilization (%) since ``start``; NaN without a sampler or a sample."""
    if sampler is None:
        return math.nan
    sampler.terminate()
    out, _ = sampler.communicate(timeout=10)
    samples = [float(line) for line in out.split() if line.isdigit()]
    return sum(samples) / len(samples) if samples else math.nan
