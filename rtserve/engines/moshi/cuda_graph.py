"""Capture a per-frame step as CUDA graphs (docs/engines.md#one-graph-per-frame).

Shared by every lockstep model whose frame is thousands of small kernels (the Moshi
``FrameStep``, the Kyutai TTS step): each variant of the step runs once eagerly on a side
stream first (kernel loading, algorithm choice and ``fused`` compilation stay out of
capture), then is captured into its own graph; all variants share one memory pool, since
they replay one at a time. The step must read and write only tensors allocated before
capture (state updated in place), so a replay is a pure function of their contents; its
outputs are static buffers that the next replay overwrites.

The warm-up steps really ran: the caller puts its state back afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

K = TypeVar("K")
T = TypeVar("T")


def capture_graphs(
    step: Callable[[K], T], keys: Iterable[K], device: torch.device
) -> dict[K, tuple[torch.cuda.CUDAGraph, T]]:
    """One graph per key of ``step(key)``, with its static outputs."""
    keys = list(keys)
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # torch leaves Stream.__new__ unannotated
    side.wait_stream(current)
    with torch.no_grad(), torch.cuda.stream(side):
        for key in keys:
            step(key)
    current.wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[K, tuple[torch.cuda.CUDAGraph, T]] = {}
    for key in keys:
        graph = torch.cuda.CUDAGraph()
        # thread_local: an unsafe CUDA call (an allocation) of another thread, e.g. an engine
        # stepping beside this build, neither fails nor breaks this capture.
        with torch.no_grad(), torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            out = step(key)
        graphs[key] = (graph, out)
    return graphs
