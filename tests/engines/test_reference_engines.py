"""The weight-free reference engines and their registry entries."""

from __future__ import annotations

import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, LockstepConfig, ServerConfig
from rtserve.engines.protocols import EngineSession
from rtserve.engines.reference import LoopbackModel, ToneModel
from rtserve.engines.registry import create_engine
from rtserve.engines.values import FrameOutput, SessionOptions, SlotPrompt


def _audio(output: FrameOutput | None) -> np.ndarray:
    """A stepped slot's audio (a slot that was stepped has an output)."""
    assert output is not None
    return output.audio


@pytest.mark.parametrize("name, text", [("loopback", False), ("tone", False), ("tiny", True)])
async def test_registered_engines_advertise_moshi_framing(name: str, text: bool) -> None:
    config = ServerConfig(engine=name, lockstep=LockstepConfig(batch_size=3))
    engine = create_engine(name, config, CollectorRegistry())
    caps = engine.capabilities
    assert (caps.name, caps.mode, caps.max_sessions) == (name, "lockstep", 3)
    assert (caps.input_sample_rate, caps.output_sample_rate, caps.chunk_period_ms) == (24_000, 24_000, 80)
    assert caps.input_frame_samples == 1920 and caps.supports_text_output is text
    assert engine.model_ids() == [name]
    assert not engine.ready
    await engine.start()
    try:
        assert engine.ready
        session = await engine.open_session("s1", SessionOptions())
        assert isinstance(session, EngineSession)
        await session.close()
    finally:
        await engine.stop()


def test_loopback_model_delays_each_slot_independently() -> None:
    model = LoopbackModel(batch_size=2, delay_frames=1, frame_size=4, sample_rate=50)
    for slot in (0, 1):
        model.open_slot(slot, SlotPrompt())
    frames = np.array([[1, 1, 1, 1], [2, 2, 2, 2]], np.float32)
    first = model.step(frames, np.array([True, True]))
    frames[:] = [[3, 3, 3, 3], [4, 4, 4, 4]]
    second = model.step(frames, np.array([True, False]))
    assert [_audio(o).tolist() for o in first] == [[0] * 4, [0] * 4]
    assert _audio(second[0]).tolist() == [1] * 4 and second[1] is None
    frames[:] = 0
    assert _audio(model.step(frames, np.array([False, True]))[1]).tolist() == [2] * 4


def test_a_loopback_step_lasts_its_configured_time() -> None:
    """``reference.loopback_step_ms``: the served path of a model as slow as a real one's step."""
    model = LoopbackModel(batch_size=1, delay_frames=0, step_s=0.05, frame_size=4, sample_rate=50)
    model.open_slot(0, SlotPrompt())
    started = time.monotonic()
    output = model.step(np.ones((1, 4), np.float32), np.array([True]))[0]
    assert time.monotonic() - started >= 0.05
    assert _audio(output).tolist() == [1] * 4


def test_tone_engine_plays_one_continuous_sine_per_slot() -> None:
    model = ToneModel(batch_size=3, base_hz=180.0, step_hz=90.0)
    for slot in range(3):
        model.open_slot(slot, SlotPrompt())
    silent = np.zeros((3, model.frame_size), np.float32)
    steps = [model.step(silent, np.array([True, True, True])) for _ in range(8)]
    for slot, expected_hz in enumerate((180.0, 270.0, 360.0)):
        audio = np.concatenate([_audio(step[slot]) for step in steps])
        spectrum = np.abs(np.fft.rfft(audio))
        peak_hz = np.argmax(spectrum) * model.sample_rate / audio.size
        assert abs(peak_hz - expected_hz) <= model.sample_rate / audio.size
        # Phase-continuous across frame boundaries: no jump larger than one sample's slope.
        max_slope = 2 * np.pi * expected_hz / model.sample_rate * model.amplitude
        assert np.abs(np.diff(audio)).max() <= max_slope * 1.01
        assert np.abs(audio).max() == pytest.approx(model.amplitude, rel=1e-3)


def test_tone_frequencies_above_nyquist_are_a_config_error() -> None:
    config = ServerConfig(lockstep=LockstepConfig(batch_size=256))
    with pytest.raises(ConfigError, match="tone_step_hz"):
        create_engine("tone", config, CollectorRegistry())
