"""``SttStream.flush`` on the tiny Kyutai STT engine: the model's delay is stepped on inserted
silence, which answers the markers placed so far, while a marker placed after it still waits
for its own audio and the model's delay (markers count the client's samples, not the silence)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine
from rtserve.engines.kyutai_stt.events import Marker, Step
from tests.engines.kyutai_stt.stt_tiny import TinyStt

FRAME = 1920
AFTER_FLUSH_FRAMES = 3


@pytest.mark.parametrize("flush_rows", [0, 1])
async def test_a_flush_answers_the_markers_so_far_and_a_later_marker_waits_for_its_audio(
    config: ServerConfig, tiny_stt: TinyStt, flush_rows: int
) -> None:
    """Also with the drain steps in a flush batch of their own (``flush_rows``)."""
    update = {"weights": str(tiny_stt.folder), "batch_size": 2, "flush_rows": flush_rows}
    settings = config.stt_engine.model_copy(update=update)
    engine = KyutaiSttEngine(config.model_copy(update={"stt_engine": settings}), registry=CollectorRegistry())
    await engine.start()
    try:
        stream = await engine.open_stream("flushed")
        delay = stream.delay_frames
        rng = np.random.default_rng(3)
        stream.push_audio(rng.uniform(-0.3, 0.3, 5 * FRAME + FRAME // 2).astype(np.float32))  # a tail too
        stream.mark(1)
        stream.flush()
        stream.push_audio(rng.uniform(-0.3, 0.3, AFTER_FLUSH_FRAMES * FRAME).astype(np.float32))
        stream.mark(2)
        stream.end_input()
        answered: dict[int, int] = {}  # marker -> the step it came with
        step = 0

        async def read() -> None:
            nonlocal step
            async for event in stream.events():
                if isinstance(event, Step):
                    step = event.step_idx
                elif isinstance(event, Marker):
                    answered[event.id] = step

        await asyncio.wait_for(read(), 30)
        assert sorted(answered) == [1, 2]
        # Marker 1 comes the delay after its five whole frames, on the flush's frames (the tail,
        # zero-padded, then the delay's silence). Marker 2 needs all of those and the frames sent
        # after them stepped, then the delay again: counted in the client's samples it would
        # have been answered a delay after the third flushed frame, 3 steps after marker 1.
        assert answered[2] - answered[1] == 1 + delay + AFTER_FLUSH_FRAMES
        await stream.close(5)
    finally:
        await engine.stop()
