"""A process-wide precision setting switched for a scope, safe when several threads switch it.

PyTorch keeps cuBLAS's fp32 precision (``torch.backends.cuda.matmul.fp32_precision``) in one
global, not per thread. The Mimi codec switches it to TF32 around the convolutions it runs as
matmuls (``mimi._conv_precision``), and an engine process runs several codecs on their own
threads (the STT's encoder, the TTS's decoder). With each scope saving and restoring the value
on its own, two overlapping scopes interleave as: A saves "ieee" and sets "tf32", B saves
"tf32", A restores "ieee", B restores "tf32"; every fp32 matmul of the process then runs in
TF32 for good. Here the first scope in saves the value and the last one out restores it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol


class _PrecisionSetting(Protocol):
    fp32_precision: str


class SharedPrecision:
    """``scope()`` holds ``setting.fp32_precision`` at ``value`` while any thread is inside one."""

    def __init__(self, setting: _PrecisionSetting, value: str) -> None:
        self._setting, self._value = setting, value
        self._lock = threading.Lock()
        self._inside = 0
        self._saved = ""

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._saved = self._setting.fp32_precision
                self._setting.fp32_precision = self._value
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    self._setting.fp32_precision = self._saved
