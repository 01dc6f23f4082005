"""Timed words from text tokens (``WordTracker``), and a stream on a real scheduler: silence
prefix as prefill, markers after the delay, ``end_input`` draining the last words
(docs/engines.md#kyutai-stt-engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.kyutai_stt.events import EndWord, Marker, Step, SttEvent, Word
from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_stt.loader import SttModel
from rtserve.engines.kyutai_stt.settings import SttSettings
from rtserve.engines.kyutai_stt.stream import SttStream
from rtserve.engines.kyutai_stt.words import WordTracker
from rtserve.engines.lockstep.framing import InvalidAudio
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.engines.values import SlotPrompt

FRAME = 1920


def _decode(ids: Sequence[int]) -> str:
    return " " + "".join(chr(ord("a") + i - 10) for i in ids)


def test_words_start_at_the_end_of_padding_and_end_at_the_next() -> None:
    settings = SttSettings(delay_s=0.5, prefix_s=0.0, frame_rate=12.5, max_delay=0)
    tracker = WordTracker(settings, _decode, padding_id=3, end_padding_id=0)
    tokens = [3, 3, 0, 10, 11, 3, 3, 0, 12, 3]
    events = [e for step, token in enumerate(tokens) for e in tracker.feed(step, token)]
    events += tracker.flush()
    boundary = 8 / 12.5 - 0.5
    assert [(type(e).__name__, getattr(e, "text", None)) for e in events] == [
        ("Word", "ab"),
        ("EndWord", None),
        ("Word", "c"),
        ("EndWord", None),
    ]
    times = [e.start_time if isinstance(e, Word) else e.stop_time for e in events if isinstance(e, Word | EndWord)]
    # The first boundary (step 2) is (2 + 1) / 12.5 - 0.5 < 0: clamped. The stream ends inside the
    # last word's padding: flushed, it ends at the last step fed.
    assert times == pytest.approx([0.0, boundary, boundary, 10 / 12.5 - 0.5])


def test_the_silence_prefix_is_not_client_time() -> None:
    settings = SttSettings(delay_s=0.5, prefix_s=1.0, frame_rate=12.5, max_delay=1)
    tracker = WordTracker(settings, _decode, padding_id=3, end_padding_id=0)
    assert settings.prefix_frames == 13 and settings.delay_frames == 8
    assert tracker.time_of(13 + 6 + 9) == pytest.approx(29 / 12.5 - 13 / 12.5 - 0.5)


async def test_a_stream_prefills_answers_its_marker_and_drains_at_the_end(stt: SttModel) -> None:
    config = ServerConfig()
    model = SttFrameModel(stt, 2)
    lockstep = config.lockstep.model_copy(update={"latency_trim_window_frames": None, "max_input_backlog_ms": 10_000})
    scheduler = LockstepScheduler(model, lockstep, CollectorRegistry(), name="stt-test")
    lease = scheduler.acquire(SlotPrompt())
    c = stt.loaded.lm_config
    stream = SttStream(
        lease, stt.settings, WordTracker(stt.settings, stt.tokenizer.decode, c.text_padding_id, 0), FRAME
    )
    with pytest.raises(InvalidAudio):
        stream.push_audio(np.array([0.0, np.inf], np.float32))
    audio = (0.3 * np.random.default_rng(1).standard_normal(10 * FRAME + 500)).astype(np.float32)
    stream.push_audio(audio)
    stream.mark(5)
    stream.end_input()
    events: list[SttEvent] = []

    async def consume() -> None:
        async for event in stream.events():
            events.append(event)

    task = asyncio.create_task(consume())
    ticks = 0
    while not task.done() and ticks < 200:
        scheduler.tick()
        ticks += 1
        await asyncio.sleep(0)
    await asyncio.wait_for(task, 5)
    prefix, delay = stt.settings.prefix_frames, stt.settings.delay_frames
    steps = [e for e in events if isinstance(e, Step)]
    # The prefix is prefill (no Step); then 11 frames of audio (the tail zero-padded) and the drain.
    assert steps[0].step_idx == prefix + 1
    assert len(steps) == 11 + delay
    assert all(len(s.prs) == 3 for s in steps)
    marker_at = events.index(Marker(5))
    steps_before = sum(isinstance(e, Step) for e in events[:marker_at])
    assert steps_before == 10 + delay, "the marker waits for its 10 whole frames and the delay, not the tail"
    assert stream.pending_markers == 0
    words = [e for e in events if isinstance(e, Word | EndWord)]
    assert all(isinstance(w, EndWord) or w.text for w in words)
    await stream.close(1.0)
