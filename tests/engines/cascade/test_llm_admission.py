"""The LLM decode thread's admission (``llm_stage.DecodeQueue``): a burst of requests that
reaches an idle loop starts as one batch (``cascade.llm_gather_ms``), not as a batch that
each newcomer restarts. The queue runs its real logic on its own thread; only the decode
step is replaced by recording what each ``admit`` returned."""

from __future__ import annotations

import threading

from rtserve.engines.cascade.llm_stage import DecodeQueue, LlmRequest
from rtserve.engines.values import ChatMessage, SamplingParams

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


class Lanes(DecodeQueue):
    """Each lane keeps what it admitted active (a running batch) until ``finish`` is set."""

    def __init__(self, max_active: int, lanes: int, gather_s: float) -> None:
        super().__init__(max_active, max_waiting=16, gather_s=gather_s, lanes=lanes)
        self.batches: list[tuple[str, int]] = []
        self.admitted = threading.Event()
        self.finish = threading.Event()
        self.two_running = threading.Barrier(lanes + 1)

    def serve(self) -> None:
        while (admitted := self.admit(())) is not None:
            self.batches.append((threading.current_thread().name, len(admitted)))
            self.admitted.set()
            self.two_running.wait(30)  # both lanes hold a batch at once
            self.finish.wait(30)

    def release_model(self) -> None:
        pass


def test_two_lanes_split_a_burst_and_decode_at_once() -> None:
    """``cascade.llm_lanes``: eight requests of a burst become two batches of four, one per lane,
    running at the same time (a single lane would take them as one batch)."""
    queue = Lanes(max_active=8, lanes=2, gather_s=HOUR)
    queue.start()
    for _ in range(8):
        queue.submit(request())
    queue.two_running.wait(30)
    assert sorted(size for _, size in queue.batches) == [4, 4]
    assert len({lane for lane, _ in queue.batches}) == 2
    queue.finish.set()
    queue.stop()
    queue.join(30)


def test_a_request_waiting_for_an_idle_lane_does_not_restart_a_running_batch() -> None:
    queue = Lanes(max_active=8, lanes=2, gather_s=0.0)
    for _ in range(4):  # waiting before the lanes start: the first lane takes all four and keeps decoding
        queue.submit(request())
    queue.start()
    assert queue.admitted.wait(30)
    queue.submit(request())
    assert not queue.has_waiting  # the idle lane takes it: the running batch has no reason to yield
    queue.two_running.wait(30)
    assert sorted(size for _, size in queue.batches) == [1, 4]
    queue.finish.set()
    queue.stop()
    queue.join(30)
