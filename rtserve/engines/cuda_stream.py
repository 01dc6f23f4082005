"""A GPU engine thread's work on a CUDA stream of its own (``lockstep.own_cuda_stream``;
docs/engines.md#own-cuda-streams).

Every thread of a process queues its kernels on the device's default stream unless told
otherwise, so two engine threads in one process (the voice agent's Kyutai STT and TTS) share
one queue: each one's wait for its step's outputs also waits for whatever the other queued
before it. On a stream each, their steps may overlap and each waits for its own work alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch

from rtserve.config import LockstepConfig


@contextlib.contextmanager
def own_stream(device: torch.device) -> Iterator[None]:
    """The calling thread's CUDA work goes to a new stream while the context lasts."""
    # The loading threads' work (weights, state, graph warm-ups) on the default stream is done
    # before a stream that does not wait for it reads what it wrote.
    torch.cuda.synchronize(device)
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # torch leaves Stream.__new__ unannotated
    with torch.cuda.stream(stream):
        yield


def engine_thread_context(
    config: LockstepConfig, device: torch.device
) -> Callable[[], AbstractContextManager[None]] | None:
    """What a GPU engine's scheduler enters in its thread (``LockstepScheduler(thread_context=)``)."""
    if not config.own_cuda_stream or device.type != "cuda":
        return None
    return lambda: own_stream(device)
