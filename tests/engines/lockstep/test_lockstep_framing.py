"""Tick-aligned framing (InputBacklog), drift trimming, the one output hand-off, drains."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.lockstep import SlotLease
from rtserve.engines.lockstep.slots import InputBacklogs, OutputHandoff
from rtserve.engines.values import FrameOutput, SpeechStep
from tests.engines.lockstep.lockstep_fakes import FRAME, PERIOD, frame, make_scheduler, metric

CUSHION = round(LockstepConfig().jitter_cushion_ms * 100 / 1000)  # samples at the fakes' 100 Hz


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
    out, _ = _popped(lease.output)
    assert not out.audio[: -packet.size].any()
    np.testing.assert_array_equal(out.audio[-packet.size :], packet)  # the newest sample ends the frame
    assert lease.underruns == 1 and lease.samples_consumed == packet.size  # only the opening tick was silent


def test_silence_stepped_for_a_stream_in_cadence_is_counted_whole_frames_and_padding_alike() -> None:
    """An underrun counts only ticks that found nothing; a page that came partly late steps the
    rest of its frame as silence too, and the silence counter has both."""
    scheduler, _, registry = make_scheduler()
    lease = scheduler.acquire()
    scheduler.tick()  # opens the slot: no stream yet, no silence counted
    lease.push_samples(frame(1.0))
    scheduler.tick()  # in cadence from here
    scheduler.tick()  # nothing came: an underrun, a frame of silence
    lease.push_samples(frame(1.0, FRAME // 4))
    scheduler.tick()  # a quarter of a frame came: the rest is silence, no underrun
    assert lease.underruns == 2  # the opening tick and the empty one
    silence = metric(registry, "rtserve_lockstep_silence_stepped_seconds_total")
    assert silence == pytest.approx((FRAME + FRAME * 3 // 4) * PERIOD / FRAME)


def test_whole_frames_stay_intact_and_more_than_a_frame_steps_the_oldest_first() -> None:
    scheduler, _, registry = make_scheduler()
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(1.0), frame(2.0), ramp(0, 3)]))
    got = []
    for _ in range(3):
        scheduler.tick()
        got.append(_popped(lease.output)[0].audio)
    # The second whole frame waited one tick more than the first: one standing frame, counted once.
    assert metric(registry, "rtserve_lockstep_standing_input_frames_total") == 1
    np.testing.assert_array_equal(got[0], frame(1.0))
    np.testing.assert_array_equal(got[1], frame(2.0))
    np.testing.assert_array_equal(got[2], np.concatenate([np.zeros(FRAME - 3, np.float32), ramp(0, 3)]))


def test_drift_trimming_drops_only_a_few_of_the_quietest_samples() -> None:
    table = InputBacklogs(1, FRAME, limit=8 * FRAME, trim_window=2, cushion=FRAME, trim_samples=2)
    backlog = table.hold(0)
    loud = np.full(3 * FRAME, 0.5, np.float32)
    loud[FRAME + 4 : FRAME + 6] = 0.001  # a quiet spot in the standing backlog
    backlog.push(loud)
    row = np.empty(FRAME, np.float32)
    assert backlog.take_into(row) == (FRAME, 0)
    assert backlog.take_into(row) == (FRAME, 0)  # standing FRAME: within the one-frame cushion
    backlog.push(np.full(2 * FRAME, 0.5, np.float32))  # a burst: 3 frames now stand
    backlog.push(np.full(4, 0.001, np.float32))
    assert backlog.take_into(row) == (FRAME, 0)
    assert backlog.take_into(row) == (FRAME, 2)  # a window above the cushion: 2 samples trimmed
    assert len(backlog) == FRAME + 2  # 2 of the 4 quiet samples went, nothing loud
    assert np.count_nonzero(table._buf[0, : len(backlog)] < 0.01) == 2


def test_late_20ms_packets_cost_half_a_packet_once_and_no_speech_with_the_default_cushion() -> None:
    """WebRTC-style 20 ms packets, four a tick, every fifth tick one of them arrives just after
    it. The first late packet steps its packet of silence, the second half of it (the default 10
    ms cushion stood); from then on the slot's cushion holds that half packet more, so later ones
    step none and at most a packet stands: latency grew once by half a packet, not per event,
    and only pauses are trimmed."""
    scheduler, _, _ = make_scheduler()
    lease = scheduler.acquire()
    scheduler.tick()  # opens the slot
    lease.output.pop()
    packet = FRAME // 4
    sent = 0

    def next_packet() -> np.ndarray:
        nonlocal sent
        sent += 1
        return np.array([float(sent)] + [0.001] * (packet - 1), np.float32)  # speech, then a pause

    silent, standing, stepped = [], [], []
    late: np.ndarray | None = None
    for tick in range(60):
        packets = [next_packet() for _ in range(4)]
        if late is not None:
            packets.insert(0, late)
            late = None
        if tick % 5 == 4:
            late = packets.pop()  # lands just after this tick
        for p in packets:
            lease.push_samples(p)
        scheduler.tick()
        audio = _popped(lease.output)[0].audio
        stepped.append(audio)
        silent.append(int(np.count_nonzero(audio == 0.0)))
        standing.append(len(lease.input))
    assert silent[4] == FRAME // 4 and silent[9] == CUSHION  # nothing stood yet, then the cushion had
    settled = range(20, 60)
    assert {silent[i] for i in settled} == {0}
    assert max(standing[i] for i in settled) <= 2 * CUSHION
    loud = np.concatenate(stepped)
    loud = loud[loud >= 1.0]
    np.testing.assert_array_equal(loud, np.arange(1.0, loud.size + 1))  # every word stepped, in order
    assert loud.size >= sent - 4  # all but the last tick's standing packets


def _edge_stream(
    late: set[int], ticks: int, late_window: int | None, late_release: int = 1000
) -> tuple[list[int], list[int], list[int], np.ndarray]:
    """Whole frames (80 ms pages), one pushed before each take, except the ticks in ``late``,
    whose frame lands just after it. Per take: silence stepped, samples trimmed, standing after
    it; and every sample stepped, in order (frame k's samples are k*FRAME+1 ...)."""
    table = InputBacklogs(
        1, FRAME, limit=16 * FRAME, trim_window=25, cushion=1, trim_samples=1, repay_samples=2,
        late_window=late_window, late_release=late_release,
    )  # fmt: skip
    backlog = table.hold(0)
    row = np.empty(FRAME, np.float32)
    silent, trimmed, standing, stepped = [], [], [], []
    for tick in range(ticks):
        if tick not in late:
            backlog.push(ramp(tick * FRAME, FRAME))
        got, cut = backlog.take_into(row)
        silent.append(FRAME - got)
        trimmed.append(cut)
        stepped.append(row[FRAME - got :].copy())
        if tick in late:
            backlog.push(ramp(tick * FRAME, FRAME))
        standing.append(len(backlog))
    return silent, trimmed, standing, np.concatenate(stepped)


def test_a_stream_at_the_edge_of_the_tick_keeps_its_late_frame_after_the_second_miss() -> None:
    """A stream whose pages reach the engine at the very edge of the tick misses it now and then.
    Repaying each miss (trimming the late frame away) brings it back to the edge for the next:
    silence stepped and audio trimmed every time. After its second miss its cushion holds the
    late frame instead: later late pages cost nothing, no audio goes, one frame of latency."""
    late = {10, 30, 50, 70, 90}
    silent, trimmed, standing, stepped = _edge_stream(late, 100, late_window=125)
    assert [tick for tick in range(1, 100) if silent[tick]] == [10, 30]
    assert sum(trimmed[30:]) == 0 and standing[-1] == FRAME  # the late frame stands: +1 frame
    after = stepped[stepped > 30 * FRAME]
    np.testing.assert_array_equal(after, np.arange(30 * FRAME + 1, 30 * FRAME + after.size + 1))  # every sample
    # As before (the growth off): every late page steps silence and its late audio is trimmed.
    silent, trimmed, standing, _ = _edge_stream(late, 100, late_window=None)
    assert [tick for tick in range(1, 100) if silent[tick]] == sorted(late)
    assert sum(trimmed[30:]) >= 3 * (FRAME - 1) and standing[-1] <= 1


def test_a_grown_cushion_goes_once_the_late_frame_stops_being_needed() -> None:
    """Misses at 10 and 30 grow the cushion; 40 takes on time later the growth goes and the trim
    window takes the standing frame away: latency back to the jitter cushion, no silence stepped."""
    silent, trimmed, standing, _ = _edge_stream({10, 30}, 120, late_window=125, late_release=40)
    assert standing[69] == FRAME and sum(trimmed[30:70]) == 0  # held while the growth lasts
    assert standing[-1] <= 1 and sum(trimmed[70:]) == FRAME - 1
    assert [tick for tick in range(1, 120) if silent[tick]] == [10, 30]


def test_trimmed_samples_are_counted() -> None:
    scheduler, _, registry = make_scheduler(
        latency_trim_window_frames=1, jitter_cushion_ms=0, drift_trim_ms=20
    )  # 2 samples at 100 Hz
    lease = scheduler.acquire()
    lease.push_samples(np.concatenate([frame(1.0), frame(2.0)]))
    scheduler.tick()
    assert lease.samples_trimmed == 2
    assert metric(registry, "rtserve_lockstep_trimmed_input_samples_total") == 2
    assert len(lease.input) == FRAME - 2


def _popped(handoff: OutputHandoff) -> tuple[FrameOutput, int]:
    got = handoff.pop()
    assert got is not None, "nothing was handed over"
    return got


def test_a_dropped_output_frame_passes_its_text_to_the_next_frame() -> None:
    handoff = OutputHandoff(limit=2)
    audio = np.zeros(FRAME, np.float32)
    assert not handoff.put(FrameOutput(audio, "Hel"), 0)
    assert not handoff.put(FrameOutput(audio + 2), 0)
    assert handoff.put(FrameOutput(audio + 3, "lo"), 0)  # the first frame's audio goes, its text moves on
    got = [_popped(handoff), _popped(handoff)]
    assert [float(out.audio[0]) for out, _ in got] == [2.0, 3.0]
    assert "".join(out.text or "" for out, _ in got) == "Hello"


def test_a_dropped_speech_frame_passes_the_steps_its_words_began_at_to_the_next_frame() -> None:
    """Word timestamps survive a stalled reader: a text-to-speech frame dropped for room hands
    the steps its words began at to the next one, whose counts already cover them."""
    handoff = OutputHandoff(limit=1)
    silence = np.zeros(FRAME, np.float32)
    handoff.put(FrameOutput(silence, speech=SpeechStep(5, 2, False, word_starts=(3, 5))), 0)
    assert handoff.put(FrameOutput(silence, speech=SpeechStep(6, 3, False, word_starts=(6,))), 0)
    speech = _popped(handoff)[0].speech
    assert speech is not None and (speech.words_started, speech.word_starts) == (3, (3, 5, 6))


def test_text_of_a_dropped_frame_never_crosses_into_a_newer_epoch() -> None:
    handoff = OutputHandoff(limit=1)
    audio = np.zeros(FRAME, np.float32)
    handoff.put(FrameOutput(audio, "stale"), 0)
    handoff.put(FrameOutput(audio, "fresh"), 1)
    assert _popped(handoff)[0].text == "fresh"


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


def test_last_tick_due_is_set_by_each_tick() -> None:
    scheduler, _, _ = make_scheduler()
    assert scheduler.last_tick_due() is None
    scheduler.acquire()
    scheduler.tick()
    first = scheduler.last_tick_due()
    scheduler.tick()
    assert first is not None and (due := scheduler.last_tick_due()) is not None and due >= first


def test_a_late_packet_is_repaid_within_a_few_ticks_not_after_the_trim_window() -> None:
    """An 80 ms packet arriving just after its tick: the engine steps silence, then the packet
    and its successor stand. The standing frame is latency the server added; it goes within
    a few ticks (repay) instead of standing for the whole trim window."""
    quarter = FRAME // 4
    backlog = InputBacklogs(
        1, FRAME, limit=8 * FRAME, trim_window=25, cushion=0, trim_samples=1, repay_samples=quarter
    ).hold(0)
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
    backlog = InputBacklogs(
        1, FRAME, limit=8 * FRAME, trim_window=25, cushion=0, trim_samples=1, repay_samples=FRAME
    ).hold(0)
    row = np.empty(FRAME, np.float32)
    backlog.push(np.full(FRAME, 0.5, np.float32))
    backlog.take_into(row)
    for _ in range(10):
        backlog.take_into(row)  # a pause: silence stepped, at most one frame of debt
    backlog.push(np.full(FRAME, 0.5, np.float32))
    assert backlog.take_into(row) == (FRAME, 0)  # stood within the cushion: the debt is gone
    backlog.push(np.full(3 * FRAME, 0.5, np.float32))  # a later burst is the client's own
    assert backlog.take_into(row) == (FRAME, 0)


def test_taking_every_slot_at_once_matches_taking_them_one_by_one() -> None:
    """``take_frames`` (the engine thread's one take per tick) against the per-slot take, on the
    same random pushes: on time, late, early, bursts and pauses, with trimming and repayment."""
    slots, ticks = 12, 300
    args = dict(
        limit=6 * FRAME, trim_window=3, cushion=FRAME // 8, trim_samples=2, repay_samples=FRAME // 4,
        late_window=10, late_release=5,
    )  # fmt: skip
    batched, single = InputBacklogs(slots, FRAME, **args), InputBacklogs(slots, FRAME, **args)
    holders = [(batched.hold(s), single.hold(s)) for s in range(slots)]
    rng = np.random.default_rng(7)
    frames_a = np.full((slots, FRAME), 9.0, np.float32)
    frames_b = frames_a.copy()
    live = np.array([0, 2, 3, 5, 6, 7, 8, 10, 11], np.intp)
    for _ in range(ticks):
        for slot in range(slots):
            size = int(rng.choice([0, 0, FRAME, FRAME, FRAME, FRAME // 4, FRAME + 3, 3 * FRAME]))
            pcm = rng.standard_normal(size).astype(np.float32) * rng.choice([0.0, 0.01, 1.0], size)
            assert holders[slot][0].push(pcm) == holders[slot][1].push(pcm)
        taken, trimmed, standing, _ = batched.take_frames(live, frames_a)
        one_by_one = [holders[slot][1].take_into(frames_b[slot]) for slot in live]
        assert list(zip(taken.tolist(), trimmed.tolist(), strict=True)) == one_by_one
        assert standing.tolist() == [len(holders[slot][1]) // FRAME for slot in live]
        np.testing.assert_array_equal(frames_a, frames_b)
        assert [len(a) for a, _ in holders] == [len(b) for _, b in holders]


def test_a_released_holder_cannot_reach_its_successors_input() -> None:
    table = InputBacklogs(1, FRAME, limit=4 * FRAME)
    old = table.hold(0)
    old.push(frame(1.0))
    new = table.hold(0)  # the slot's next session: its input starts empty
    assert len(new) == 0
    assert old.push(frame(2.0)) == 0 and old.clear() == 0 and len(new) == 0
    new.push(frame(3.0))
    row = np.empty(FRAME, np.float32)
    assert old.take_into(row) == (0, 0)
    assert new.take_into(row) == (FRAME, 0)
    np.testing.assert_array_equal(row, frame(3.0))


def spoken(value: float) -> np.ndarray:
    """A frame of "speech": six loud samples worth ``value``, then a two-sample pause."""
    out = np.full(FRAME, value, np.float32)
    out[-2:] = 0.001
    return out


def run_stalled_event_loop(stall_ticks: int) -> tuple[SlotLease, list[np.ndarray], list[int], CollectorRegistry]:
    """Default config: a client sending frame k (``spoken(k)``) every tick whose frames 10 ..
    10 + stall_ticks - 1 are held up by a stalled event loop and pushed at once after it; the
    engine thread kept ticking meanwhile (silence). Returns the lease, every stepped frame and
    the backlog after each tick."""
    scheduler, _, registry = make_scheduler()
    lease = scheduler.acquire(session_id="s1")
    scheduler.tick()  # opens the slot
    lease.output.pop()
    stepped: list[np.ndarray] = []
    standing: list[int] = []
    for tick in range(1, 120):
        if tick < 10 or tick >= 10 + stall_ticks:
            for k in range(10, 10 + stall_ticks + 1) if tick == 10 + stall_ticks else (tick,):
                lease.push_samples(spoken(float(k)))
        scheduler.tick()
        stepped.append(_popped(lease.output)[0].audio)
        standing.append(len(lease.input))
    return lease, stepped, standing, registry


def test_a_burst_after_a_one_second_event_loop_stall_loses_no_speech_and_its_latency_is_repaid() -> None:
    """The loop stalls for 12 ticks (960 ms) while the engine thread steps silence, then delivers
    the held-up frames at once. None of them is dropped; the standing second is repaid from the
    pauses (quietest samples) within a few seconds instead of standing for the session."""
    lease, stepped, standing, registry = run_stalled_event_loop(12)

    assert lease.samples_dropped == 0 and lease.samples_discarded == 0
    assert metric(registry, "rtserve_lockstep_dropped_input_frames_total") == 0
    audio = np.concatenate(stepped)
    loud = audio[audio > 0.5]
    # Every loud sample of every frame was stepped, once, in order: only pauses were trimmed.
    np.testing.assert_array_equal(loud, np.repeat(np.arange(1.0, 120.0, dtype=np.float32), FRAME - 2))
    assert lease.samples_trimmed == 12 * FRAME - CUSHION  # the standing burst, from pauses only
    assert metric(registry, "rtserve_lockstep_trimmed_input_samples_total") == lease.samples_trimmed
    assert max(standing) > 11 * FRAME  # the burst stood...
    back = next(i for i, n in enumerate(standing) if i > 22 and n <= CUSHION)
    assert back <= 22 + 50  # ...and was repaid at underrun_repay_ms a tick (4 s here), not drift-trimmed for 16 s
    assert all(n <= CUSHION for n in standing[back:])


def test_input_beyond_the_backlog_bound_is_dropped_oldest_first_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 2 s stall: more than the default 1.2 s bound arrives at once. The oldest part goes,
    never silently: counted per session and in the metric, and logged with the session id."""
    lease, stepped, _, registry = run_stalled_event_loop(25)

    limit = round(LockstepConfig().max_input_backlog_ms * 100 / 1000)
    dropped = 26 * FRAME - limit  # frames 10..35 arrived at once
    assert lease.samples_dropped == lease.samples_discarded == dropped
    assert metric(registry, "rtserve_lockstep_dropped_input_frames_total") == dropped / FRAME
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "backlog bound" in r.getMessage()]
    assert len(warnings) == 1 and getattr(warnings[0], "session_id", None) == "s1"  # the log call's extra
    assert "dropped" in warnings[0].getMessage()
    audio = np.concatenate(stepped)
    loud = audio[audio > 0.5]
    assert np.all(np.diff(loud) >= 0)  # what is left is in order
    assert set(np.unique(loud)) == set(np.arange(1.0, 120.0)) - set(np.arange(10.0, 10.0 + dropped // FRAME))


async def test_a_ticks_sessions_are_woken_oldest_stepped_input_first() -> None:
    """The loop serves a tick's sessions one after another; input that arrived just after the
    previous tick has waited longest, so its session is woken (and its frame sent) first."""
    scheduler, _, _ = make_scheduler()
    leases = [scheduler.acquire() for _ in range(3)]
    scheduler.tick()  # opens the slots
    for lease in (leases[2], leases[0], leases[1]):  # arrival order
        lease.push_samples(frame(1))
        await asyncio.sleep(0.002)
    woken: list[int] = []
    for lease in leases:
        while lease.output.pop() is not None:
            pass
        lease.on_wake(functools.partial(woken.append, lease.slot))
    scheduler.tick()
    await asyncio.sleep(0.05)  # the notifier's wake-up runs on this loop
    assert woken == [leases[2].slot, leases[0].slot, leases[1].slot]
