"""The cascade hearing with a streaming STT takes input at the model's rate
(docs/engines.md#cascade-streaming-asr): the model hears the client's samples as they came,
whole band, while the VAD (16 kHz) still marks the turn on the same timeline."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.audio import resample
from rtserve.engines.cascade.session import CascadeSession
from rtserve.engines.cascade.stream_asr import WORD_END_MARGIN_S, StreamAsr
from rtserve.engines.events import SpeechStarted, SpeechStopped
from rtserve.engines.kyutai_stt.events import SttEvent
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import Pcm, SessionOptions
from tests.engines.cascade.cascade_support import Loaded, Recorder

pytestmark = pytest.mark.models

MODEL_RATE = 24000


class RecordingStream:
    """A ``SpeechStream`` that keeps what it is sent and says nothing."""

    def __init__(self) -> None:
        self.pushed: list[np.ndarray] = []
        self.marked_at: list[int | None] = []
        self.closed = asyncio.Event()

    @property
    def pending_markers(self) -> int:
        return 0

    def push_audio(self, pcm: Pcm) -> None:
        self.pushed.append(np.array(pcm, copy=True))

    def mark(self, marker_id: int, samples: int | None = None) -> None:
        self.marked_at.append(samples)

    def flush(self) -> None:
        pass

    async def events(self) -> AsyncGenerator[SttEvent, None]:
        await self.closed.wait()
        return
        yield

    async def close(self, release_timeout_s: float) -> None:
        self.closed.set()


def test_the_engine_takes_input_at_the_streaming_models_rate(tmp_path: Path) -> None:
    whisper = CascadeEngine(load_config(environ={}), CollectorRegistry())
    heard = load_config(
        environ={}, overrides={"cascade": {"asr": "stt_engine"}, "stt_engine": {"weights": str(tmp_path)}}
    )
    streaming = CascadeEngine(heard, CollectorRegistry())  # not started: nothing is loaded
    assert (whisper.capabilities.input_sample_rate, streaming.capabilities.input_sample_rate) == (16000, MODEL_RATE)


async def test_the_model_hears_the_client_samples_unchanged_and_the_vad_still_marks_the_turn(
    cascade: Loaded, question_16k: np.ndarray
) -> None:
    engine = cascade.engine
    stream = RecordingStream()
    session = CascadeSession(
        "hearing",
        dataclasses.replace(engine.capabilities, input_sample_rate=MODEL_RATE),
        engine._models,
        SessionOptions(server_vad=TurnDetection(type="server_vad", silence_duration_ms=500)),
        engine._config.cascade,
        max_pending_turns=2,
        metrics=engine._metrics,
        on_close=lambda _: None,
        hearing=lambda report: StreamAsr(stream, MODEL_RATE, MODEL_RATE, 1.0, report),
    )
    # Full band: the question at 24 kHz plus a 10 kHz tone, which 16 kHz audio cannot carry.
    question = resample(question_16k, 16000, MODEL_RATE)
    tone = 0.05 * np.sin(2 * np.pi * 10000 * np.arange(len(question)) / MODEL_RATE).astype(np.float32)
    spoken = np.concatenate([question + tone, np.zeros(MODEL_RATE, np.float32)])
    events = Recorder(session)
    try:
        for start in range(0, len(spoken), 720):  # 30 ms chunks
            session.push_audio(spoken[start : start + 720])
            await asyncio.sleep(0.002)
        stopped = await events.wait_for(lambda e: isinstance(e, SpeechStopped))
        assert isinstance(stopped, SpeechStopped)
        for _ in range(20):
            await asyncio.sleep(0)
    finally:
        await session.close()
    assert np.array_equal(np.concatenate(stream.pushed), spoken)
    started = events.of(SpeechStarted)[0]
    # The turn's marks are on the VAD's 16 kHz timeline of the same audio: speech lies inside it.
    speech_ms = 1000 * len(question) / MODEL_RATE
    assert 0 <= started.audio_ms < speech_ms / 2
    assert speech_ms - 500 < stopped.audio_ms <= speech_ms + 100  # 24 kHz scored as 16 kHz: ~1.3x later
    # The VAD sealed the turn after 500 ms of silence; its marker went where the speech stopped
    # (plus the last word's margin), not where the audio sent so far ended: the model heard that
    # silence meanwhile. Later by at most the VAD resampler's lag and one chunk.
    (marked,) = stream.marked_at
    expected = (stopped.audio_ms / 1000 + WORD_END_MARGIN_S) * MODEL_RATE
    assert marked is not None and expected - 0.01 * MODEL_RATE <= marked <= expected + 0.1 * MODEL_RATE
