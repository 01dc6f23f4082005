"""The voice sandbox: a child process that loads and speaks user-uploaded Piper voices.

``python -m rtserve.processes.voice_sandbox LIMITS_JSON``, started by
``engines/cascade/voice_sandbox.py``, which also kills it at its wall-clock limit. Before it
loads anything it caps its own address space (``RLIMIT_AS``: an allocation beyond fails in
here, never in the server) and lowers its CPU priority (the server's own voices, ASR and LLM
go first on a shared core). Each request then gets ``RLIMIT_CPU`` seconds of CPU time on
top of what the process has used so far; past it the kernel ends the process (SIGXCPU).

Requests and replies are ``engines/piper_voice.py`` frames on stdin/stdout:

``{"op": "speak", "model", "key", "text", "speed", "max_samples"}`` -> ``{"sample_rate",
"samples"}`` and the float32 audio; or ``{"error": "load" | "speak" | "memory" | "too_long",
"message"}``. Synthesis stops at the first Piper sentence that takes the audio past
``max_samples``. Up to ``max_loaded`` voices stay loaded by ``key`` (which names the file's
identity, so a deleted and re-registered voice is loaded afresh; least recently used dropped
before another loads); a request's ``forget`` keys are dropped first (voices deleted since).
Anything the libraries print goes to stderr: stdout carries frames only.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.piper_voice import PiperModel, read_frame, write_frame

_NICE = 10  # below the server's own work; the kernel still gives it what is left over
_MAX_REQUEST_BYTES = 1 << 20


def _is_memory_error(exc: BaseException) -> bool:
    # numpy raises MemoryError; onnxruntime's allocator failures arrive as its own exception types
    # whose message says so.
    return isinstance(exc, MemoryError) or "alloc" in str(exc).lower()


class _Sandbox:
    def __init__(self, cpu_threads: int, cpu_s: float, max_loaded: int) -> None:
        self._cpu_threads = cpu_threads
        self._cpu_s = cpu_s
        self._max_loaded = max_loaded
        self._voices: OrderedDict[str, PiperModel] = OrderedDict()

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        for key in request.get("forget", ()):  # voices deleted since the last request
            self._voices.pop(str(key), None)
        self._grant_cpu()
        try:
            voice = self._load(str(request["model"]), str(request["key"]))
        except Exception as exc:  # noqa: BLE001 - whatever the upload makes the loader raise is its fault
            return {"error": "memory" if _is_memory_error(exc) else "load", "message": type(exc).__name__}, b""
        max_samples = int(request["max_samples"])
        pieces: list[FloatArray] = []
        samples = 0
        try:
            for piece in voice.chunks(str(request["text"]), float(request["speed"])):
                samples += piece.size
                if samples > max_samples:
                    return {"error": "too_long", "message": f"more than {max_samples} samples"}, b""
                pieces.append(np.asarray(piece, dtype=np.float32).reshape(-1))
        except Exception as exc:  # noqa: BLE001 - likewise whatever running it raises
            return {"error": "memory" if _is_memory_error(exc) else "speak", "message": type(exc).__name__}, b""
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        reply = {"sample_rate": voice.sample_rate, "samples": int(audio.size), "loaded": len(self._voices)}
        return reply, audio.tobytes()

    def _grant_cpu(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = usage.ru_utime + usage.ru_stime
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(used + self._cpu_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))

    def _load(self, model: str, key: str) -> PiperModel:
        if (voice := self._voices.get(key)) is not None:
            self._voices.move_to_end(key)
            return voice
        # Make room first: the memory cap is sized for max_loaded voices, not one more.
        while len(self._voices) >= self._max_loaded:
            self._voices.popitem(last=False)
        voice = self._voices[key] = PiperModel(Path(model), self._cpu_threads)
        return voice


def _frames_out() -> IO[bytes]:
    """The original stdout, kept for frames; fd 1 then points at stderr for anything printed."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return out


def main(argv: list[str]) -> int:
    limits = json.loads(argv[0])
    memory = int(limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    os.nice(_NICE)
    sandbox = _Sandbox(int(limits["cpu_threads"]), float(limits["cpu_s"]), int(limits["max_loaded"]))
    frames_in, frames_out = sys.stdin.buffer, _frames_out()
    while (frame := read_frame(frames_in, _MAX_REQUEST_BYTES)) is not None:
        header, payload = sandbox.handle(frame[0])
        write_frame(frames_out, header, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
