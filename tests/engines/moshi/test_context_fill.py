"""``moshi_engine.context_fill_frames`` (benchmarking): an opened slot starts with a long context
of random KV instead of an empty one; its fill is spread over the range, it holds the KV blocks
that window needs (paged), a pool too small refuses it with the typed error, and it steps on
(and wraps) like a conversation that got there by talking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtserve.config import ConfigError, load_config
from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.paged_kv import KVMemoryExhausted, PagedKVSpec
from rtserve.engines.values import SlotPrompt


def _model(loaded: LoadedModel, batch: int, fill: tuple[int, int], paged: PagedKVSpec | None) -> MoshiFrameModel:
    return MoshiFrameModel(loaded, batch, graph=False, paged_kv=paged, context_fill=fill)


def _step(model: MoshiFrameModel, live: np.ndarray) -> list[np.ndarray]:
    frames = 0.1 * np.random.default_rng(0).standard_normal((model.batch_size, model.frame_size)).astype(np.float32)
    return [o.audio for o in model.step(frames, live) if o is not None]


@torch.no_grad()
def test_opened_slots_start_at_fills_spread_over_the_range_holding_their_windows_blocks(loaded: LoadedModel) -> None:
    spec = PagedKVSpec(num_blocks=40, block_size=8)  # context 40: 5 blocks per row at most
    model = _model(loaded, 8, (0, 38), spec)
    fills = [model.context_fill_frames(slot) for slot in range(8)]
    assert min(fills) <= 5 and max(fills) >= 30 and 14 <= np.mean(fills) <= 24  # spread, centred
    for slot in range(8):
        model.open_slot(slot, SlotPrompt())
    transformer = model.loaded.lm.transformer
    assert transformer.blocks is not None
    assert transformer.offset.tolist() == fills and model.frame.positions.tolist() == fills
    assert [transformer.blocks.held(slot) for slot in range(8)] == [fill // 8 + 1 for fill in fills]
    live = np.ones(8, bool)
    for _ in range(12):  # past the 40-frame ring for the fullest rows: they reuse their own blocks
        audio = _step(model, live)
        assert len(audio) == 8 and all(np.isfinite(a).all() for a in audio)
    assert [transformer.blocks.held(slot) for slot in range(8)] == [min(5, (f + 11) // 8 + 1) for f in fills]
    model.release(3)
    model.open_slot(3, SlotPrompt())  # a reopened slot starts at its fill again
    assert model.frame.positions[3] == fills[3]


@torch.no_grad()
def test_a_pool_too_small_for_the_fill_refuses_the_slot_with_the_typed_error(loaded: LoadedModel) -> None:
    model = _model(loaded, 2, (38, 38), PagedKVSpec(num_blocks=7, block_size=8))
    model.open_slot(0, SlotPrompt())  # 5 blocks
    with pytest.raises(KVMemoryExhausted):
        model.open_slot(1, SlotPrompt())  # 5 more: only 2 free
    blocks = model.loaded.lm.transformer.blocks
    assert blocks is not None and blocks.held(1) == 0 and blocks.free_blocks == 2


@torch.no_grad()
def test_ring_kv_rows_start_filled_too(loaded: LoadedModel) -> None:
    model = _model(loaded, 2, (30, 30), None)
    model.open_slot(0, SlotPrompt())
    assert model.loaded.lm.transformer.offset.tolist() == [30, 0]
    assert float(model.loaded.lm.transformer.caches[0].keys[0].abs().sum()) > 0  # random KV, not the reset zeros
    for _ in range(15):
        assert all(np.isfinite(a).all() for a in _step(model, np.array([True, False])))


def test_the_setting_takes_an_ordered_range(tmp_path: object) -> None:
    fill = load_config(environ={"RTSERVE_MOSHI_ENGINE__CONTEXT_FILL_FRAMES": "[0, 3000]"}).moshi_engine
    assert fill.context_fill_frames == (0, 3000)
    with pytest.raises(ConfigError, match="context_fill_frames"):
        load_config(environ={"RTSERVE_MOSHI_ENGINE__CONTEXT_FILL_FRAMES": "[3000, 0]"})
