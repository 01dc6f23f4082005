"""A client's sampling parameters (``SlotPrompt.sampling``) decode that slot only; fields it
leaves out keep the engine's defaults, and a slot without any stays on the engine's setting."""

from __future__ import annotations

import numpy as np
import torch

from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.values import SlotPrompt, SlotSampling

FRAME = 1920
TICKS = 10
GREEDY = MoshiSampling(use_sampling=False)


def _audio(model: MoshiFrameModel, prompts: list[SlotPrompt], inputs: np.ndarray) -> list[np.ndarray]:
    for slot, prompt in enumerate(prompts):
        model.open_slot(slot, prompt)
    live = np.ones(model.batch_size, bool)
    outputs = [model.step(inputs[t], live) for t in range(inputs.shape[0])]
    per_slot = []
    for slot in range(model.batch_size):
        frames = [o[slot] for o in outputs]
        assert all(f is not None for f in frames), f"slot {slot} was not live on every tick"
        per_slot.append(np.stack([f.audio for f in frames if f is not None]))
    return per_slot


def test_a_slots_sampling_overrides_the_engine_default_for_that_slot_only(loaded: LoadedModel) -> None:
    inputs = (0.3 * np.random.default_rng(2).standard_normal((TICKS, 2, FRAME))).astype(np.float32)
    hot = SlotSampling(text_temperature=1.0, audio_temperature=1.0)
    mixed = _audio(
        MoshiFrameModel(loaded, 2, sampling=GREEDY), [SlotPrompt(seed=7, sampling=hot), SlotPrompt()], inputs
    )
    greedy = _audio(MoshiFrameModel(loaded, 2, sampling=GREEDY), [SlotPrompt(), SlotPrompt()], inputs)
    # The same draws as an engine whose default is that sampling (unnamed fields: its top-k).
    default_hot = MoshiSampling(use_sampling=True, temperature=1.0, temperature_text=1.0)
    sampled = _audio(MoshiFrameModel(loaded, 2, sampling=default_hot), [SlotPrompt(seed=7), SlotPrompt(seed=7)], inputs)
    assert not np.array_equal(mixed[0], greedy[0]), "the slot's sampling parameters were not applied"
    assert np.array_equal(mixed[0], sampled[0])
    assert np.array_equal(mixed[1], greedy[1]), "the other slot must keep the engine's greedy default"


def test_zero_temperatures_decode_greedily_and_reopening_forgets_the_last_clients_sampling(loaded: LoadedModel) -> None:
    inputs = (0.3 * np.random.default_rng(3).standard_normal((TICKS, 1, FRAME))).astype(np.float32)
    greedy = _audio(MoshiFrameModel(loaded, 1, sampling=GREEDY), [SlotPrompt()], inputs)[0]
    model = MoshiFrameModel(loaded, 1, sampling=GREEDY)
    cold = _audio(
        model, [SlotPrompt(seed=1, sampling=SlotSampling(text_temperature=0.0, audio_temperature=0.0))], inputs
    )[0]
    assert np.array_equal(cold, greedy)
    _audio(model, [SlotPrompt(seed=1, sampling=SlotSampling(text_temperature=2.0, audio_temperature=2.0))], inputs)
    assert np.array_equal(_audio(model, [SlotPrompt()], inputs)[0], greedy)


def test_a_sampling_row_draws_from_the_softmax_within_its_top_k() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    sampler = SlotSampler(2, torch.device("cpu"), GREEDY)
    sampler.configure(0, MoshiSampling(use_sampling=True, temperature=1.0, top_k=0), seed=3)
    sampler.configure(1, MoshiSampling(use_sampling=True, temperature=1.0, top_k=3), seed=4)
    draws = torch.stack([sampler.sample(logits.expand(2, -1), text=False) for _ in range(4000)])
    freq = torch.bincount(draws[:, 0], minlength=6).float() / draws.shape[0]
    assert torch.allclose(freq, torch.softmax(logits, dim=0), atol=0.03), freq
    top3 = torch.bincount(draws[:, 1], minlength=6).float() / draws.shape[0]
    assert top3[3:].sum() == 0, "a token outside the row's top-k was drawn"
    assert torch.allclose(top3[:3], torch.softmax(logits[:3], dim=0), atol=0.03), top3
