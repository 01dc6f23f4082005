"""Tick-aligned framing (InputBacklog), drift trimming, the one output hand-off, drains."""

from __future__ import annotations

import asyncio

import numpy as np
from lockstep_fakes import FRAME, frame, make_scheduler, metric

from rtserve.engines.lockstep.slots import InputBacklog, OutputHandoff
from rtserve.engines.protocols import FrameOutput


def ramp(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.float32) + 1  # no zeros: silence stays recognisable


def test_a_short_packet_is_stepped_at_the_next_tick_padded_at_its_start() -> None:
    scheduler, _, _ = make_scheduler()
    lease = scheduler.acquire()
    scheduler.tick()  # opens the slot
    lease.output.pop()
    packet = ramp(0, FRAME // 4)  # a 20 ms packet of an 80 ms frame
    lease.push_samples(packet)
    scheduler.tick()  # the next tick steps it: no wait for the rest of the frame
    out, _ = lease.output.pop()
    assert not out.audio[:-packet.size].any()
    np.testing.assert_array_equal(out.audio[-packet.size:], packet)  # the newest sample ends the frame
    assert lease.underruns == 1 and lease.samples_consumed == packet.size  # only the opening tick was silent


def test_whole_frames_stay_intact_and_more_than_a_frame_steps_the_oldest_first() -> None:
    scheduler, _, _ = make_scheduler()
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(1.0), frame(2.0), ramp(0, 3)]))
    got = []
    for _ in range(3):
        scheduler.tick()
        got.append(lease.output.pop()[0].audio)
    np.testing.assert_array_equal(got[0], frame(1.0))
    np.testing.assert_array_equal(got[1], frame(2.0))
    np.testing.assert_array_equal(got[2], np.concatenate([np.zeros(FRAME - 3, np.float32), ramp(0, 3)]))


def test_drift_trimming_drops_only_a_few_of_the_quietest_samples() -> None:
    backlog = InputBacklog(FRAME, limit_frames=8, trim_window=2, cushion=FRAME, trim_samples=2)
    loud = np.full(3 * FRAME, 0.5, np.float32)
    loud[FRAME + 4:FRAME + 6] = 0.001  # a quiet spot in the standing backlog
    backlog.push(loud)
    row = np.empty(FRAME, np.float32)
    assert backlog.take_into(row) == (FRAME, 0)
    assert backlog.take_into(row) == (FRAME, 0)  # standing FRAME: within the one-frame cushion
    backlog.push(np.full(2 * FRAME, 0.5, np.float32))  # a burst: 3 frames now stand
    backlog.push(np.full(4, 0.001, np.float32))
    assert backlog.take_into(row) == (FRAME, 0)
    assert backlog.take_into(row) == (FRAME, 2)  # a window above the cushion: 2 samples trimmed
    assert len(backlog) == FRAME + 2  # 2 of the 4 quiet samples went, nothing loud
    assert np.count_nonzero(backlog._buf[:len(backlog)] < 0.01) == 2


def test_trimmed_samples_are_counted() -> None:
    scheduler, _, registry = make_scheduler(latency_trim_window_frames=1, jitter_cushion_ms=0,
                                            drift_trim_ms=20)  # 2 samples at 100 Hz
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(1.0), frame(2.0)]))
    scheduler.tick()
    assert lease.samples_trimmed == 2
    assert metric(registry, "rtserve_lockstep_trimmed_input_samples_total") == 2
    assert len(lease.input) == FRAME - 2


def test_a_dropped_output_frame_passes_its_text_to_the_next_frame() -> None:
    handoff = OutputHandoff(limit=2)
    audio = np.zeros(FRAME, np.float32)
    assert not handoff.put(FrameOutput(audio, "Hel"), 0)
    assert not handoff.put(FrameOutput(audio + 2), 0)
    assert handoff.put(FrameOutput(audio + 3, "lo"), 0)  # the first frame's audio goes, its text moves on
    got = [handoff.pop(), handoff.pop()]
    assert [float(out.audio[0]) for out, _ in got] == [2.0, 3.0]
    assert "".join(out.text or "" for out, _ in got) == "Hello"


def test_text_of_a_dropped_frame_never_crosses_into_a_newer_epoch() -> None:
    handoff = OutputHandoff(limit=1)
    audio = np.zeros(FRAME, np.float32)
    handoff.put(FrameOutput(audio, "stale"), 0)
    handoff.put(FrameOutput(audio, "fresh"), 1)
    assert handoff.pop()[0].text == "fresh"


async def test_wait_drained_waits_for_the_delayed_answer_and_its_reader() -> None:
    scheduler, _, _ = make_scheduler()
    scheduler.output_delay_frames = 1  # the answer to a frame comes one tick later
    lease = scheduler.acquire()
    scheduler.tick()
    lease.output.pop()
    lease.push_samples(frame(1.0))
    drained = asyncio.create_task(lease.wait_drained())
    scheduler.tick()  # steps the input
    await asyncio.sleep(0)
    assert not drained.done()
    scheduler.tick()  # produces the delayed answer
    for _ in range(3):
        await asyncio.sleep(0)
    assert not drained.done()  # produced but not read yet
    while lease.output.pop() is not None:
        pass
    lease.wake()  # what next_output's emptying pop signals
    await asyncio.wait_for(drained, 1)


def test_last_tick_started_is_set_by_each_tick() -> None:
    scheduler, _, _ = make_scheduler()
    assert scheduler.last_tick_started() is None
    scheduler.acquire()
    scheduler.tick()
    first = scheduler.last_tick_started()
    scheduler.tick()
    assert first is not None and scheduler.last_tick_started() >= first


def test_a_late_packet_is_repaid_within_a_few_ticks_not_after_the_trim_window() -> None:
    """An 80 ms packet arriving just after its tick: the engine steps silence, then the packet
    and its successor stand. The standing frame is latency the server added; it goes within
    a few ticks (repay) instead of standing for the whole trim window."""
    quarter = FRAME // 4
    backlog = InputBacklog(FRAME, limit_frames=8, trim_window=25, cushion=0, trim_samples=1, repay_samples=quarter)
    row = np.empty(FRAME, np.float32)
    backlog.push(np.full(FRAME, 0.5, np.float32))
    assert backlog.take_into(row) == (FRAME, 0)
    assert backlog.take_into(row) == (0, 0)  # the next packet is late: silence stepped
    backlog.push(np.full(FRAME, 0.5, np.float32))  # it arrives; the stream goes on on time
    trimmed = []
    for _ in range(5):
        backlog.push(np.full(FRAME, 0.5, np.float32))
        trimmed.append(backlog.take_into(row)[1])
    assert trimmed == [quarter, quarter, quarter, quarter, 0]  # the late frame repaid over four ticks
    assert len(backlog) == 0


def test_a_client_pause_is_not_a_debt_for_its_next_burst() -> None:
    backlog = InputBacklog(FRAME, limit_frames=8, trim_window=25, cushion=0, trim_samples=1, repay_samples=FRAME)
    row = np.empty(FRAME, np.float32)
    backlog.push(np.full(FRAME, 0.5, np.float32))
    backlog.take_into(row)
    for _ in range(10):
        backlog.take_into(row)  # a pause: silence stepped, at most one frame of debt
    backlog.push(np.full(FRAME, 0.5, np.float32))
    assert backlog.take_into(row) == (FRAME, 0)  # stood within the cushion: the debt is gone
    backlog.push(np.full(3 * FRAME, 0.5, np.float32))  # a later burst is the client's own
    assert backlog.take_into(row) == (FRAME, 0)
