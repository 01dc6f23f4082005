"""LockstepSessionEngine end to end on the real engine thread, with the loopback engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig, ReferenceEngineConfig, ServerConfig
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import EngineEvent, EngineFailure, OutputAudio
from rtserve.engines.lockstep import LockstepSession, LockstepSessionEngine
from rtserve.engines.lockstep.framing import InvalidAudio
from rtserve.engines.lockstep.slots import SlotPhase
from rtserve.engines.protocols import EngineSession
from rtserve.engines.registry import create_engine
from rtserve.engines.values import FrameOutput, SessionOptions, SlotPrompt
from tests.engines.lockstep.lockstep_fakes import RecordingModel

FRAME = 1920
DELAY = 2


@pytest.fixture
async def engine() -> AsyncIterator[LockstepSessionEngine]:
    config = ServerConfig(
        engine="loopback",
        lockstep=LockstepConfig(batch_size=2),
        reference=ReferenceEngineConfig(loopback_delay_frames=DELAY),
    )
    engine = create_engine("loopback", config, CollectorRegistry())
    assert isinstance(engine, LockstepSessionEngine)
    await engine.start()
    yield engine
    await engine.stop()


def noise(frames: float, seed: int = 0) -> np.ndarray:
    # Uniform in [0.1, 0.5): no sample is 0, so echoed audio never looks like silence.
    return np.random.default_rng(seed).uniform(0.1, 0.5, int(frames * FRAME)).astype(np.float32)


async def read_frames(session: EngineSession, count: int) -> list[OutputAudio]:
    got: list[OutputAudio] = []

    async def read() -> None:
        async for event in session.events():
            assert isinstance(event, OutputAudio)
            got.append(event)
            if len(got) == count:
                return

    await asyncio.wait_for(read(), 10)
    return got


def first_sound(frames: list[OutputAudio]) -> int:
    return next(i for i, f in enumerate(frames) if f.pcm.any())


async def test_loopback_echoes_input_after_the_delay_frame_aligned(engine: LockstepSessionEngine) -> None:
    assert engine.ready and engine.capabilities.public()["duplex"] is True
    session = await engine.open_session("s1", SessionOptions())
    audio = noise(3)
    session.push_audio(audio[: int(2.5 * FRAME)])  # unaligned chunks are re-framed...
    session.push_audio(audio[int(2.5 * FRAME) :])
    await session.commit_input()  # ...into exactly three steps
    frames = await read_frames(session, DELAY + session.lease.underruns + 3)
    assert all(f.pcm.shape == (FRAME,) and f.pcm.dtype == np.float32 for f in frames)
    assert all(f.epoch == 0 and f.text is None for f in frames)
    lead = first_sound(frames)
    # Silence for the delay (plus any ticks that ran before the first input arrived), then the
    # input itself, bit for bit, starting exactly on a frame boundary.
    assert DELAY <= lead <= DELAY + session.lease.underruns
    assert not np.concatenate([f.pcm for f in frames[:lead]]).any()
    echoed = np.concatenate([f.pcm for f in frames[lead : lead + 3]])
    assert np.array_equal(echoed, audio)
    assert session.lease.samples_consumed == 3 * FRAME
    await session.close()


async def test_a_partial_tail_is_padded_and_stepped_on_commit(engine: LockstepSessionEngine) -> None:
    session = await engine.open_session("s1", SessionOptions())
    half = noise(0.5, seed=1)
    session.push_audio(half)
    await session.commit_input()
    assert session.lease.samples_consumed == half.size
    frames = await read_frames(session, DELAY + session.lease.underruns + 1)
    lead = first_sound(frames)
    echoed = frames[lead].pcm
    # Padded at its start: the newest sample ends the frame (tick-aligned framing).
    assert np.array_equal(echoed[-half.size :], half) and not echoed[: -half.size].any()
    await session.commit_input()  # nothing pending: returns at once, steps nothing more
    assert session.lease.samples_consumed == half.size
    await session.close()


async def test_clear_input_drops_the_partial_tail(engine: LockstepSessionEngine) -> None:
    session = await engine.open_session("s1", SessionOptions())
    session.push_audio(noise(0.3, seed=2))
    session.clear_input()
    audio = noise(1, seed=3)
    session.push_audio(audio)
    await session.commit_input()
    frames = await read_frames(session, DELAY + session.lease.underruns + 1)
    assert np.array_equal(frames[first_sound(frames)].pcm, audio)
    await session.close()


async def test_bad_audio_gets_a_typed_error_and_the_session_keeps_working(engine: LockstepSessionEngine) -> None:
    session = await engine.open_session("s1", SessionOptions())
    for bad in (np.zeros((2, FRAME), np.float32), np.full(10, np.nan, np.float32), np.zeros(FRAME, np.int16)):
        with pytest.raises(InvalidAudio) as err:
            session.push_audio(bad)  # type: ignore[arg-type]  # an int16 array among them, on purpose
        assert err.value.code == "invalid_audio"
    audio = noise(1, seed=4)
    session.push_audio(audio.astype(np.float64))  # float64 is converted, not rejected
    await session.commit_input()
    frames = await read_frames(session, DELAY + session.lease.underruns + 1)
    assert np.array_equal(frames[first_sound(frames)].pcm, audio)
    await session.close()


async def test_set_epoch_fences_older_output(engine: LockstepSessionEngine) -> None:
    session = await engine.open_session("s1", SessionOptions())
    session.push_audio(noise(3, seed=5))
    await session.commit_input()
    await asyncio.sleep(0.3)  # let epoch-0 frames pile up in the hand-off
    session.set_epoch(1)
    session.push_audio(noise(1, seed=6))
    frames = await read_frames(session, 2)
    assert [f.epoch for f in frames] == [1, 1]
    await session.close()


async def test_capacity_refusal_and_close_frees_the_slot_at_once(engine: LockstepSessionEngine) -> None:
    first = await engine.open_session("s1", SessionOptions())
    await engine.open_session("s2", SessionOptions())
    with pytest.raises(CapacityExhausted):
        await engine.open_session("s3", SessionOptions())
    reader = asyncio.create_task(read_frames(first, 10_000))
    await first.close()
    await first.close()  # idempotent
    assert len(await asyncio.wait_for(reader, 5)) < 10_000  # events() ended on close
    third = await engine.open_session("s3", SessionOptions())  # the closed session's slot is free again
    assert third.lease.slot == first.lease.slot
    await third.close()


async def test_events_end_when_the_session_closes(engine: LockstepSessionEngine) -> None:
    session = await engine.open_session("s1", SessionOptions())

    async def drain() -> int:
        return sum([1 async for _ in session.events()])

    reader = asyncio.create_task(drain())
    await asyncio.sleep(0.2)
    await session.close()
    assert await asyncio.wait_for(reader, 5) >= 1  # ended, after some (silent) live frames


async def test_engine_stop_fails_open_sessions() -> None:
    config = ServerConfig(lockstep=LockstepConfig(batch_size=1))
    engine = create_engine("loopback", config, CollectorRegistry())
    with pytest.raises(EngineError) as not_started:
        await engine.open_session("s1", SessionOptions())
    assert not_started.value.code == "engine_unavailable"
    await engine.start()
    session = await engine.open_session("s1", SessionOptions())
    await engine.stop()
    events = [event async for event in session.events()]
    assert events[-1] == EngineFailure("engine_unavailable", "the engine stopped")
    assert not engine.ready
    await session.close()  # closing after the engine stopped is harmless


async def test_open_session_returns_only_once_the_prefill_is_done() -> None:
    """Transports announce readiness (Moshi 0x00, session.created) when open_session returns."""
    model = RecordingModel(batch_size=2, frame_size=80, sample_rate=1000)  # 80 ms frames
    engine = LockstepSessionEngine("recording", model, ServerConfig(), CollectorRegistry(), supports_text_output=False)
    await engine.start()
    try:
        session = await engine.open_session("s1", SessionOptions(prompt=SlotPrompt(text="abc")))
        assert session.lease.phase is SlotPhase.LIVE
        assert [c for c in model.calls if c[0] == "prefill"] == [("prefill", 0)] * 3
        await session.close()
    finally:
        await engine.stop()


async def wait_for(predicate: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), 10)


async def test_forwarded_events_carry_the_echo_and_end_with_none_on_close(engine: LockstepSessionEngine) -> None:
    """The engine process forwards lockstep frames without a task per session: the same frames,
    fenced by epoch, then ``None``."""
    session = await engine.open_session("s1", SessionOptions())
    await asyncio.sleep(0.2)  # epoch-0 frames queue up meanwhile
    session.set_epoch(1)
    forwarded: list[EngineEvent | None] = []
    session.forward_events(forwarded.append)
    audio = noise(2, seed=7)
    session.push_audio(audio)
    await session.commit_input()
    await wait_for(lambda: sum(isinstance(e, OutputAudio) and e.pcm.any() for e in forwarded) == 2)
    frames = [e for e in forwarded if isinstance(e, OutputAudio)]
    assert {f.epoch for f in frames} == {1}
    assert np.array_equal(np.concatenate([f.pcm for f in frames if f.pcm.any()]), audio)
    await session.close()
    await wait_for(lambda: forwarded[-1] is None)
    assert forwarded.count(None) == 1


async def test_forwarded_events_end_with_the_failure_when_the_engine_stops() -> None:
    engine = create_engine("loopback", ServerConfig(lockstep=LockstepConfig(batch_size=1)), CollectorRegistry())
    await engine.start()
    session = await engine.open_session("s1", SessionOptions())
    assert isinstance(session, LockstepSession)
    forwarded: list[EngineEvent | None] = []
    session.forward_events(forwarded.append)
    await engine.stop()
    await wait_for(lambda: bool(forwarded) and forwarded[-1] is None)
    assert forwarded[-2] == EngineFailure("engine_unavailable", "the engine stopped")
    await session.close()


class _BlockRowsModel(RecordingModel):
    """Hands out each live row's frame as a view of one fresh block, as ``MoshiFrameModel`` does."""

    def step(self, frames: np.ndarray, live: np.ndarray) -> list[FrameOutput | None]:
        block = frames + 1.0
        return [FrameOutput(block[i]) if live[i] else None for i in range(self.batch_size)]


async def test_frames_read_in_process_never_pin_their_ticks_batch() -> None:
    """A reader that keeps frames (a realtime session's resume journal) must hold one frame's
    samples each, not the block every slot's frame of that tick is a row of."""
    model = _BlockRowsModel(batch_size=4, frame_size=80, sample_rate=1000)
    engine = LockstepSessionEngine("rows", model, ServerConfig(), CollectorRegistry(), supports_text_output=False)
    await engine.start()
    try:
        session = await engine.open_session("s1", SessionOptions())
        kept = []
        async for event in session.events():
            assert isinstance(event, OutputAudio)
            kept.append(event.pcm)
            if len(kept) == 3:
                break
        assert all(pcm.base is None and pcm.size == 80 and (pcm == 1.0).all() for pcm in kept)
        await session.close()
    finally:
        await engine.stop()
