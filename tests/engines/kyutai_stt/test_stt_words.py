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


def _stream(stt: SttModel) -> tuple[LockstepScheduler, SttStream]:
    """A stream on a scheduler ticked by hand."""
    config = ServerConfig()
    model = SttFrameModel(stt, 2)
    lockstep = config.lockstep.model_copy(update={"latency_trim_window_frames": None, "max_input_backlog_ms": 10_000})
    scheduler = LockstepScheduler(model, lockstep, CollectorRegistry(), name="stt-test")
    lease = scheduler.acquire(SlotPrompt())
    c = stt.loaded.lm_config
    tracker = WordTracker(stt.settings, stt.tokenizer.decode, c.text_padding_id, 0)
    return scheduler, SttStream(lease, stt.settings, tracker, FRAME)


async def test_a_stream_prefills_answers_its_marker_and_drains_at_the_end(stt: SttModel) -> None:
    scheduler, stream = _stream(stt)
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


async def test_a_marker_behind_the_audio_stepped_is_due_a_delay_after_its_own_audio(stt: SttModel) -> None:
    """A turn that ended 4 frames before the audio sent (``mark(id, samples)``) is answered the
    delay after the step that took its audio, not the delay after the mark; so is a marker whose
    audio was all stepped before it came."""
    scheduler, stream = _stream(stt)
    noise = np.random.default_rng(2)
    delay = stt.settings.delay_frames
    events: list[SttEvent] = []

    async def consume() -> None:
        async for event in stream.events():
            events.append(event)

    async def tick(times: int) -> None:
        for _ in range(times):
            scheduler.tick()
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    sent = 4 + delay  # frames: the turn's 4, then the silence the VAD waited out (the delay's worth)
    stream.push_audio((0.3 * noise.standard_normal(sent * FRAME)).astype(np.float32))
    await tick(stt.settings.prefix_frames + sent)
    assert sum(isinstance(e, Step) for e in events) == sent
    stream.mark(7, samples=4 * FRAME)  # where the turn's speech ended
    stream.mark(8)  # everything sent: its last frame was stepped just now
    stream.push_audio((0.3 * noise.standard_normal(2 * delay * FRAME)).astype(np.float32))
    await tick(1)
    assert events[-1] == Marker(7), "due already: its 4 frames were stepped the delay ago"
    assert delay > 1 and Marker(8) not in events
    await tick(delay - 2)
    assert Marker(8) not in events
    await tick(1)
    assert events[-1] == Marker(8), "the delay after its last frame's step"
    stream.end_input()
    await tick(4 * delay)
    await asyncio.wait_for(task, 5)
    await stream.close(1.0)
