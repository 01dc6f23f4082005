"""The LLM decode thread's admission (``llm_stage.DecodeQueue``): a burst of requests that
reaches an idle loop starts as one batch (``cascade.llm_gather_ms``), not as a batch that
each newcomer restarts. The queue runs its real logic on its own thread; only the decode
step is replaced by recording what each ``admit`` returned."""

from __future__ import annotations

import threading

from rtserve.engines.cascade.llm_stage import DecodeQueue, LlmRequest
from rtserve.engines.protocols import ChatMessage, SamplingParams

HOUR = 3600.0  # a window nobody waits out: admission ends when the batch is full


class Recording(DecodeQueue):
    def __init__(self, max_active: int, gather_s: float) -> None:
        super().__init__(max_active, max_waiting=16, gather_s=gather_s)
        self.batches: list[int] = []
        self.admitted = threading.Event()

    def serve(self) -> None:
        while (admitted := self.admit(())) is not None:
            self.batches.append(len(admitted))
            self.admitted.set()

    def release_model(self) -> None:
        pass


def request() -> LlmRequest:
    return LlmRequest((ChatMessage("user", "hi"),), SamplingParams(), False, lambda item: None)


def test_a_burst_reaching_an_idle_loop_is_admitted_as_one_batch() -> None:
    queue = Recording(max_active=4, gather_s=HOUR)
    queue.start()
    for _ in range(4):  # the loop is already waiting when the first arrives
        queue.submit(request())
    assert queue.admitted.wait(30)
    queue.stop()
    queue.join(30)
    assert queue.batches == [4]


def test_without_a_window_the_first_request_starts_at_once() -> None:
    queue = Recording(max_active=4, gather_s=0.0)
    queue.start()
    queue.submit(request())
    assert queue.admitted.wait(30)
    queue.stop()
    queue.join(30)
    assert queue.batches == [1]
