"""Slot isolation: recycling one slot leaves every other slot's output bit-identical
(docs/engines.md#isolation), with greedy and with per-slot seeded sampling."""

from __future__ import annotations

import numpy as np

from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.sampling import MoshiSampling
from rtserve.engines.values import FrameOutput, SlotPrompt

FRAME = 1920
BATCH, TICKS, RECYCLE_AT = 4, 28, 10


def _inputs(seed: int = 5) -> np.ndarray:
    return (0.3 * np.random.default_rng(seed).standard_normal((TICKS, BATCH, FRAME))).astype(np.float32)


def _run(
    model: MoshiFrameModel, inputs: np.ndarray, recycle: int | None, seeds: list[int | None]
) -> list[list[FrameOutput | None]]:
    for slot in range(model.batch_size):
        model.open_slot(slot, SlotPrompt(seed=seeds[slot]))
    live = np.ones(model.batch_size, bool)
    outputs = []
    for tick in range(inputs.shape[0]):
        if recycle is not None and tick == RECYCLE_AT:
            model.open_slot(recycle, SlotPrompt(seed=seeds[recycle]))
        outputs.append(model.step(inputs[tick], live))
    return outputs


def _live(frames: list[FrameOutput | None]) -> list[FrameOutput]:
    """The frames of a slot that was live on every tick."""
    live = [f for f in frames if f is not None]
    assert len(live) == len(frames), "a slot was not live on every tick"
    return live


def _frames(outputs: list[list[FrameOutput | None]], slot: int) -> list[FrameOutput]:
    return _live([tick[slot] for tick in outputs])


def _audio(outputs: list[list[FrameOutput | None]], slot: int) -> np.ndarray:
    return np.stack([f.audio for f in _frames(outputs, slot)])


def _check_isolation(loaded: LoadedModel, sampling: MoshiSampling, seeds: list[int | None]) -> None:
    inputs = _inputs()
    plain = _run(MoshiFrameModel(loaded, BATCH, sampling=sampling), inputs, None, seeds)
    recycled = _run(MoshiFrameModel(loaded, BATCH, sampling=sampling), inputs, 2, seeds)
    for slot in (0, 1, 3):
        assert np.array_equal(_audio(plain, slot), _audio(recycled, slot)), f"slot {slot} changed"
        assert [f.text for f in _frames(plain, slot)] == [f.text for f in _frames(recycled, slot)]
    # The recycled slot really restarted: its first frame after the recycle is the acoustic-delay silence.
    assert not _audio(recycled, 2)[RECYCLE_AT].any()
    assert not np.array_equal(_audio(plain, 2)[RECYCLE_AT:], _audio(recycled, 2)[RECYCLE_AT:])
    # ... and replays like a pristine slot fed the same audio from that tick on.
    fresh = MoshiFrameModel(loaded, 1, sampling=sampling)
    fresh.open_slot(0, SlotPrompt(seed=seeds[2]))
    replay = _live([fresh.step(inputs[t, 2:3], np.ones(1, bool))[0] for t in range(RECYCLE_AT, TICKS)])
    got = _audio(recycled, 2)[RECYCLE_AT:]
    want = np.stack([r.audio for r in replay])
    assert np.allclose(got, want, atol=1e-5), float(np.abs(got - want).max())
    assert [f.text for f in _frames(recycled[RECYCLE_AT:], 2)] == [r.text for r in replay]


def test_greedy_recycle_of_slot_2_leaves_other_slots_bit_identical(loaded: LoadedModel) -> None:
    _check_isolation(loaded, MoshiSampling(use_sampling=False), [None] * BATCH)


def test_seeded_sampling_is_per_slot_and_isolated(loaded: LoadedModel) -> None:
    _check_isolation(loaded, MoshiSampling(use_sampling=True, temperature=1.0, temperature_text=1.0), [11, 12, 13, 14])


def test_same_seed_same_stream_different_seed_different_stream(loaded: LoadedModel) -> None:
    sampling = MoshiSampling(use_sampling=True, temperature=1.0, temperature_text=1.0)
    inputs = np.zeros((12, 2, FRAME), np.float32)
    model = MoshiFrameModel(loaded, 2, sampling=sampling)
    runs = _run_pair(model, inputs, [7, 7]), _run_pair(model, inputs, [7, 8])
    assert np.array_equal(runs[0][0], runs[0][1]), "two slots with one seed and one input must agree"
    assert not np.array_equal(runs[1][0], runs[1][1]), "different seeds must sample differently"


def _run_pair(model: MoshiFrameModel, inputs: np.ndarray, seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    for slot, seed in enumerate(seeds):
        model.open_slot(slot, SlotPrompt(seed=seed))
    outs = [model.step(inputs[t], np.ones(2, bool)) for t in range(inputs.shape[0])]
    return _audio(outs, 0), _audio(outs, 1)
