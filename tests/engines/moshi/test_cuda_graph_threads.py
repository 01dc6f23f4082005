"""``capture_graphs`` in a thread while another thread of the process keeps working on the GPU (an
engine's batch built off the event loop while the process's other engines step): neither the
capture nor the other thread's allocations, kernels and host copies fail."""

from __future__ import annotations

import threading

import pytest
import torch

from rtserve.engines.moshi.cuda_graph import capture_graphs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_capture_in_a_thread_leaves_the_other_threads_cuda_work_alone() -> None:
    device = torch.device("cuda")
    state = torch.zeros(1 << 20, device=device)

    def step(key: int) -> torch.Tensor:
        for _ in range(50):  # long enough that the other thread's calls land inside the capture
            state.add_(key).mul_(0.5)
        return state * 2

    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_stepping() -> None:
        size = 1 << 20
        try:
            while not stop.is_set():
                size = size * 5 // 4 if size < 256 << 20 else 1 << 20  # new sizes: fresh device allocations
                fresh = torch.ones(size // 4, device=device)
                assert fresh[-1:].item() == 1.0  # a kernel and a synchronizing copy to the host
        except BaseException as error:  # noqa: BLE001 - the test reports what the thread met
            errors.append(error)

    other = threading.Thread(target=keep_stepping)
    other.start()
    try:
        for _ in range(20):
            graphs = capture_graphs(step, [1, 3], device)
    finally:
        stop.set()
        other.join()
    assert errors == []
    state.zero_()
    graph, out = graphs[3]
    graph.replay()
    torch.cuda.synchronize()
    expected = torch.zeros(1, device=device)
    for _ in range(50):
        expected = (expected + 3) * 0.5
    assert torch.allclose(out[:1], expected * 2)
