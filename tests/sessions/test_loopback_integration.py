"""The session core on the real ``loopback`` lockstep engine (engine thread, real ticks).

Not a timing test: it waits for frames to come back and checks what came back.
"""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.registry import create_engine
from rtserve.sessions import SessionError, SessionManager
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from tests.sessions.conftest import HANG_GUARD_S, of_type

FRAME = 1920


async def test_loopback_echoes_input_in_whole_frames_on_one_response(config: ServerConfig) -> None:
    config.lockstep.batch_size = 2
    config.reference.loopback_delay_frames = 1
    engine = create_engine("loopback", config, CollectorRegistry())
    await engine.start()
    manager = SessionManager(engine, config.sessions)
    try:
        handle = await manager.open()
        other = await manager.open()
        try:
            await manager.open()  # the engine's two slots are taken
        except SessionError as refused:
            assert refused.code == "resource_exhausted"
        else:
            raise AssertionError("a third session was admitted on a two-slot engine")

        signal = np.random.default_rng(7).uniform(-0.5, 0.5, int(3.5 * FRAME)).astype(np.float32)
        assert handle.submit(cmd.AppendAudio(audio=signal)) is None
        received: list[ev.SessionEvent] = []

        async def until_echoed() -> None:
            assert handle.attachment is not None
            async for event in handle.attachment:
                received.append(event)
                audio = np.concatenate([a.pcm for a in of_type(received, ev.AudioDelta)] or [np.zeros(0, np.float32)])
                if np.count_nonzero(audio) >= 3 * FRAME:
                    return

        await asyncio.wait_for(until_echoed(), HANG_GUARD_S)
        await handle.close()  # flushes the half-frame tail through the engine first
        assert handle.attachment is not None
        async for event in handle.attachment:
            received.append(event)

        deltas = of_type(received, ev.AudioDelta)
        assert all(len(d.pcm) == FRAME and d.sample_rate == 24000 for d in deltas)  # whole 80 ms frames
        assert len({d.response_id for d in deltas}) == 1
        assert len(of_type(received, ev.ResponseCreated)) == len(of_type(received, ev.ResponseDone)) == 1
        assert isinstance(received[-1], ev.SessionClosed)
        audio = np.concatenate([d.pcm for d in deltas])
        start = int(np.flatnonzero(audio)[0])
        np.testing.assert_array_equal(audio[start : start + 3 * FRAME], signal[: 3 * FRAME])  # bit-exact echo

        await other.close()
        assert manager.active_count() == 0
        replacement = await manager.open()  # the slots were really released
        await replacement.close()
    finally:
        await manager.shutdown()
        await engine.stop()
