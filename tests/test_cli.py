"""The installed ``rtserve`` command: version, config errors, serve + health + SIGTERM drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import pytest

import rtserve

CLI = [sys.executable, "-m", "rtserve.cli"]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def test_version():
    out = subprocess.run([*CLI, "--version"], capture_output=True, text=True, check=True, env=CLEAN_ENV)
    assert out.stdout.strip() == f"rtserve {rtserve.__version__}"


def test_invalid_config_exits_nonzero_with_one_line(tmp_path):
    env = {**CLEAN_ENV, "RTSERVE_SESSIONS__MAX_SESSIONS": "-1"}
    out = subprocess.run([*CLI, "serve"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'sessions.max_sessions'" in lines[0]
    assert "Traceback" not in out.stderr


def test_unknown_engine_is_a_config_error():
    out = subprocess.run(
        [*CLI, "serve", "--engine", "nope", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
        timeout=60,
    )
    assert out.returncode == 2
    assert "unknown engine 'nope'" in out.stderr and "Traceback" not in out.stderr


def _healthy_loopback_server() -> tuple[subprocess.Popen[str], int]:
    """``rtserve serve --engine loopback`` in one process, once /health answers 200."""
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "serve", "--engine", "loopback", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=CLEAN_ENV,
    )
    deadline = time.monotonic() + 60
    while _health(port) != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server never became healthy: {proc.communicate()[0][-2000:]}")
        time.sleep(0.1)
    return proc, port


def test_serve_answers_health_and_drains_on_sigterm():
    proc, port = _healthy_loopback_server()
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert _health(port) is None  # no longer accepting
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_server_starts_without_the_models_extra() -> None:
    """The embedded models' libraries (the ``models`` extra) are optional: without them the server
    still imports its app, workers and engine process (the cascade reports its models missing)."""
    probe = textwrap.dedent("""
        import importlib.abc, sys
        class Missing(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in {"faster_whisper", "ctranslate2", "transformers", "piper"}:
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Missing())
        import rtserve.app, rtserve.processes.engine_main, rtserve.processes.worker_main
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_single_process_server_keeps_what_it_loaded_out_of_garbage_collections():
    proc, port = _healthy_loopback_server()
    try:
        # Frozen once everything has loaded: the robot policy loads in the background after /health is 200.
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            frozen = [
                float(line.split()[-1]) for line in text.splitlines() if line.startswith("rtserve_gc_frozen_objects ")
            ]
            if (frozen and frozen[0] > 10_000) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert frozen and frozen[0] > 10_000
    finally:
        proc.kill()
        proc.wait()
