"""NVIDIA's Multi-Process Service (MPS) around a benchmark's run: a control daemon started with
private pipe and log folders, which this process and every child it starts afterwards (they
inherit ``CUDA_MPS_PIPE_DIRECTORY``) use, and stopped at the end.

Without it, CUDA contexts of several processes on one GPU take turns in time slices: the voice
agent's STT engine process and its TTS server each wait while the other's kernels hold the GPU,
though neither fills it. Under MPS their kernels run side by side (README, "The voice agent on one
GPU"). The daemon is per user and touches no device setting; stopping it ends its server.

A client's ``CUDA_MPS_CLIENT_PRIORITY`` (NVIDIA's MPS documentation, "Environment Variables": 0
normal, 1 below normal) orders its kernels after a normal client's when both have work waiting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

CLIENT_PRIORITIES = {"normal": "0", "below_normal": "1"}


def client_priority_env(level: str) -> dict[str, str]:
    """A server's environment for MPS client priority ``level`` (a key of ``CLIENT_PRIORITIES``)."""
    return {"CUDA_MPS_CLIENT_PRIORITY": CLIENT_PRIORITIES[level]}


@contextlib.contextmanager
def mps_daemon() -> Iterator[None]:
    """Run the body with an MPS control daemon of its own; fails at once where there is none."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("--mps: nvidia-cuda-mps-control is not on PATH (NVIDIA's driver utilities)")
    with tempfile.TemporaryDirectory(prefix="rtserve-mps-") as base:
        env = {"CUDA_MPS_PIPE_DIRECTORY": f"{base}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{base}/log"}
        for folder in env.values():
            Path(folder).mkdir()
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            subprocess.run([control, "-d"], check=True)
            try:
                yield
            finally:
                _quit(control)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _quit(control: str) -> None:
    """Stop the daemon. It waits for its clients to end; one still attached (a child that has not
    exited yet) can hold it past the timeout, which must not throw away the run's results."""
    try:
        subprocess.run([control], input=b"quit\n", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        print("--mps: the MPS control daemon did not quit within 30 s (a client still attached?)", file=sys.stderr)
