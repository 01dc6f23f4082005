"""``rtserve serve`` in a child process for the load benchmarks, configured through
``RTSERVE_*`` variables, so clients and server never share one interpreter."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, env: dict[str, str], *, engine: str = "loopback", name: str = "bench") -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix=f"{name}_server_", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rtserve.cli", "serve", "--engine", engine, "--port", str(self.port),
             "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT)

    async def wait_ready(self, http: aiohttp.ClientSession, timeout_s: float = 60.0,
                         probe: Callable[[aiohttp.ClientSession], Awaitable[bool]] | None = None) -> None:
        """Until ``probe`` (default: ``/health`` answers 200) succeeds."""
        probe = probe or self._healthy
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{Path(self._log.name).read_text()[-3000:]}")
            try:
                if await probe(http):
                    return
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError("server did not become ready")

    async def _healthy(self, http: aiohttp.ClientSession) -> bool:
        async with http.get(self.base + "/health") as response:
            return response.status == 200

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        os.unlink(self._log.name)
