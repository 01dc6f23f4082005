"""Lanes of the cascade's CPU stages (``cores``, ``worker``): sized from the host's cores unless
configured, and a model worker with two lanes runs two calls at once (one waits behind the
other with one), by priority, and stops every lane."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rtserve.config import ConfigError, load_config
from rtserve.engines.cascade.cores import StageLanes, stage_lanes
from rtserve.engines.cascade.first_audio import FirstAudioWork
from rtserve.engines.cascade.worker import PRIORITY_HIGH, PRIORITY_LOW, ModelWorker
from rtserve.engines.errors import CapacityExhausted


def test_unset_lanes_are_sized_from_the_cores() -> None:
    limits = load_config(environ={}).cascade
    # Two cores: two ASR lanes (turns ending together), one TTS lane, two LLM batches of 4.
    assert stage_lanes(limits, cores=2) == StageLanes(asr=2, tts=1, llm=2, vad=1, llm_max_active=8)
    assert stage_lanes(limits, cores=1) == StageLanes(asr=2, tts=1, llm=2, vad=1, llm_max_active=8)
    assert stage_lanes(limits, cores=16) == StageLanes(asr=4, tts=4, llm=8, vad=4, llm_max_active=32)


def test_configured_lanes_win_over_the_cores() -> None:
    limits = load_config(
        environ={"RTSERVE_CASCADE__TTS_LANES": "3"},
        overrides={"cascade": {"asr_lanes": 2, "llm_lanes": 5, "llm_max_active": 6, "vad_lanes": 7}},
    ).cascade
    assert stage_lanes(limits, cores=64) == StageLanes(asr=2, tts=3, llm=5, vad=7, llm_max_active=6)


def test_a_lane_count_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cascade\.asr_lanes"):
        load_config(environ={}, overrides={"cascade": {"asr_lanes": 0}})


def meet(both: threading.Barrier) -> bool:
    try:
        both.wait()
    except threading.BrokenBarrierError:
        return False  # the other call never ran alongside this one
    return True


async def test_two_lanes_run_two_calls_at_once_and_one_lane_runs_them_in_turn() -> None:
    for lanes, together in ((2, True), (1, False)):
        worker = ModelWorker("test", max_queue=8, lanes=lanes)
        worker.start()
        both = threading.Barrier(2, timeout=0.5)
        try:
            met = await asyncio.gather(worker.run(meet, both), worker.run(meet, both))
        finally:
            worker.stop()
            worker.join(5)
        assert list(met) == [together, together], lanes


async def test_a_busy_lane_leaves_the_worker_idle_only_while_another_is_free() -> None:
    worker = ModelWorker("test", max_queue=8, lanes=2)
    worker.start()
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(5)

    try:
        first = asyncio.ensure_future(worker.run(hold))
        await asyncio.to_thread(started.acquire, True, 5)
        assert worker.idle  # one lane of two is free: optional work (a partial) may still go
        second = asyncio.ensure_future(worker.run(hold))
        await asyncio.to_thread(started.acquire, True, 5)
        assert not worker.idle
        release.set()
        await asyncio.gather(first, second)
    finally:
        worker.stop()
        worker.join(5)


async def test_urgent_jobs_run_before_waiting_later_ones() -> None:
    worker = ModelWorker("test", max_queue=8)
    worker.start()
    release = threading.Event()
    order: list[str] = []
    try:
        blocker = asyncio.ensure_future(worker.run(release.wait, 5))
        await asyncio.sleep(0.1)
        later = asyncio.ensure_future(worker.run(order.append, "later sentence", priority=PRIORITY_LOW))
        urgent = asyncio.ensure_future(worker.run(order.append, "first piece", priority=PRIORITY_HIGH))
        await asyncio.sleep(0.1)
        release.set()
        await asyncio.gather(blocker, later, urgent)
    finally:
        worker.stop()
        worker.join(5)
    assert order == ["first piece", "later sentence"]


async def test_first_audio_work_counts_urgent_jobs_until_they_end_or_are_dropped() -> None:
    first_audio = FirstAudioWork()
    worker = ModelWorker("test", max_queue=8, first_audio=first_audio)
    worker.start()
    release = threading.Event()
    try:
        running = asyncio.ensure_future(worker.run(release.wait, 5))  # a first piece being rendered
        later = asyncio.ensure_future(worker.run(int, "1", priority=PRIORITY_LOW))  # a later sentence
        queued = asyncio.ensure_future(worker.run(int, "2"))  # another turn's first piece
        await asyncio.sleep(0.1)
        assert first_audio.pending == 2  # the later sentence is not first-audio work
        queued.cancel()  # its session closed before it ran
        await asyncio.sleep(0.05)
        assert first_audio.pending == 1
        waiter = asyncio.ensure_future(asyncio.to_thread(first_audio.wait_clear, 5.0))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # later work waits while a first piece is pending
        release.set()
        assert await asyncio.wait_for(waiter, 5) < 5.0  # and goes on as soon as it ended
        assert list(await asyncio.gather(running, later)) == [True, 1]
        assert first_audio.pending == 0
    finally:
        worker.stop()
        worker.join(5)


async def test_stop_ends_every_lane() -> None:
    worker = ModelWorker("test-stop", max_queue=8, lanes=3)
    worker.start()
    assert await asyncio.gather(*(worker.run(int, "1") for _ in range(3))) == [1, 1, 1]
    worker.stop()
    worker.join(5)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("rtserve-test-stop-")]
    with pytest.raises(CapacityExhausted):
        await worker.run(int, "1")
