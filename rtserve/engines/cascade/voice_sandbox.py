"""User-uploaded voices run in a child process with memory, CPU-time and wall-clock limits.

An uploaded ``.onnx`` is a program for onnxruntime: one node can ask for gigabytes
(``ConstantOfShape``) or loop for minutes (``Loop``). Loaded in the server, such a model
took the server's memory from 1.4 to 6.5 GB while it was being proven, and a slow one held
the TTS thread every other voice waits on. So every uploaded model is loaded and run in a
child process (``processes/voice_sandbox.py``): it caps its own address space and CPU time
(``voices.sandbox_memory_bytes``, ``voices.sandbox_cpu_s``), and this side kills it when a
request runs past ``voices.sandbox_wall_s``. A breach costs the child, never the server,
and reaches the client as a typed error.

The child is started with ``subprocess`` as ``python -m rtserve.processes.voice_sandbox``,
not with ``multiprocessing``: a fresh interpreter (no fork of a server that runs threads
and holds models), no re-import of the parent's ``__main__`` (a spawn start would import
the CLI or pytest again), limits set by the child on itself before it loads anything, and
plain pipes whose end-of-file says the child died however it died.

Methods block (a pipe read waits for the child): one thread owns one ``VoiceSandbox``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.piper_voice import read_frame, write_frame
from rtserve.errors import INVALID_VOICE_MODEL, SPEECH_TOO_LONG, VOICE_MODEL_REJECTED

log = logging.getLogger(__name__)

_REPLY_HEADROOM = 1 << 16
MIN_BOUND_CHARS = 16


class VoiceModelRejected(EngineError):
    """An uploaded voice model went past a sandbox limit (memory, CPU time, wall clock)."""

    code = VOICE_MODEL_REJECTED


class SpeechTooLong(EngineError):
    """Synthesis stopped: the audio is longer than ``voices.max_speech_s_per_char`` allows."""

    code = SPEECH_TOO_LONG


@dataclass(frozen=True)
class SandboxLimits:
    memory_bytes: int
    cpu_s: float
    wall_s: float
    cpu_threads: int
    max_loaded: int


class VoiceSandbox:
    """One sandbox child, started on first use and again after it died or was killed."""

    def __init__(self, limits: SandboxLimits) -> None:
        self._limits = limits
        self._process: subprocess.Popen[bytes] | None = None
        self._forget: set[str] = set()  # keys of deleted voices the child may still hold
        self.loaded_voices = 0  # models the child held after its last answer

    def speak(
        self, model: Path, key: str, text: str, speed: float, max_samples: int, *, param: str
    ) -> tuple[FloatArray, int]:
        """``text`` spoken by ``model``: the float32 audio and its sample rate. The child keeps
        the model loaded under ``key``, which must change when the file does.

        Raises ``SpeechTooLong`` past ``max_samples``, ``VoiceModelRejected`` when the child
        breached a limit, and an ``invalid_voice_model`` error when the model does not load
        or run; ``param`` names the request field at fault."""
        forget, self._forget = self._forget, set()
        request = {"op": "speak", "model": str(model), "key": key, "text": text, "speed": speed}
        request.update(max_samples=max_samples, forget=sorted(forget))
        header, payload = self._call(request, max_samples * 4, param)
        error = header.get("error")
        if error == "too_long":
            raise SpeechTooLong(
                "the speech is longer than voices.max_speech_s_per_char allows for its text", param="input"
            )
        if error == "memory":
            raise VoiceModelRejected(
                f"the voice model needs more memory than voices.sandbox_memory_bytes "
                f"({self._limits.memory_bytes} bytes)",
                param=param,
            )
        if error is not None:
            stage = "load" if error == "load" else "speak"
            raise EngineError(f"the voice model does not {stage} with Piper", code=INVALID_VOICE_MODEL, param=param)
        audio = np.frombuffer(payload, dtype=np.float32)
        self.loaded_voices = int(header["loaded"])
        return audio, int(header["sample_rate"])

    def forget(self, key: str) -> None:
        """The voice ``key`` was deleted: the child drops its model with the next request."""
        self._forget.add(key)

    def kill(self) -> None:
        """End the child now, from any thread (shutdown); the owning thread's call then fails."""
        if (process := self._process) is not None:
            process.kill()

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()

    def _start(self) -> subprocess.Popen[bytes]:
        limits = {
            "memory_bytes": self._limits.memory_bytes,
            "cpu_s": self._limits.cpu_s,
            "cpu_threads": self._limits.cpu_threads,
            "max_loaded": self._limits.max_loaded,
        }
        # glibc reserves address space per thread arena; two keep RLIMIT_AS about real allocations.
        env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
        return subprocess.Popen(
            [sys.executable, "-m", "rtserve.processes.voice_sandbox", json.dumps(limits)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def _call(self, request: dict[str, Any], max_payload: int, param: str) -> tuple[dict[str, Any], bytes]:
        if self._process is None or self._process.poll() is not None:
            self.close()
            self._process = self._start()
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()

        timer = threading.Timer(self._limits.wall_s, expire)
        timer.daemon = True
        timer.start()
        try:
            write_frame(process.stdin, request)
            reply = read_frame(process.stdout, max_payload + _REPLY_HEADROOM)
        except (OSError, ValueError):
            reply = None  # a broken pipe or a garbled frame: the child is done for either way
        finally:
            timer.cancel()
        if reply is not None:
            return reply
        self.close()
        raise self._breach(process.returncode, expired.is_set(), param)

    def _breach(self, returncode: int | None, expired: bool, param: str) -> EngineError:
        limits = self._limits
        if expired:
            reason = f"did not finish within voices.sandbox_wall_s ({limits.wall_s:g} s)"
        elif returncode == -signal.SIGXCPU:
            reason = f"used more CPU time than voices.sandbox_cpu_s ({limits.cpu_s:g} s)"
        else:
            # Killed by the kernel or aborted by its runtime, most often an allocation past the cap.
            reason = f"stopped the sandbox (exit {returncode}); voices.sandbox_memory_bytes is {limits.memory_bytes}"
        log.warning("voice sandbox: a voice model %s", reason)
        return VoiceModelRejected(f"the voice model {reason}", param=param)


def speech_sample_bound(text: str, speed: float, seconds_per_char: float, sample_rate: int) -> int:
    """The most audio ``text`` may become: ``seconds_per_char`` per character at speed 1, counting
    at least ``MIN_BOUND_CHARS`` (a lone symbol or emoji can be spoken as several words)."""
    return math.ceil(seconds_per_char * max(len(text), MIN_BOUND_CHARS) / speed * sample_rate)
