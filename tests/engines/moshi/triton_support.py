"""Where the moshi engine's Triton kernels run in tests: compiled on CUDA; without a GPU, the
same kernel code on CPU tensors in Triton's interpreter (``TRITON_INTERPRET``, set by
tests/conftest.py on such machines)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch


def kernel_module(name: str) -> tuple[ModuleType, torch.device]:
    """The module ``name`` (one whose entry points launch Triton kernels) and the device to give
    them tensors on; skips the test where neither a GPU nor the interpreter can run them."""
    if torch.cuda.is_available():
        return importlib.import_module(name), torch.device("cuda")
    pytest.importorskip("triton", reason="the kernels need Triton (a dev dependency)")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device and Triton's interpreter is off")
    return importlib.import_module(name), torch.device("cpu")
