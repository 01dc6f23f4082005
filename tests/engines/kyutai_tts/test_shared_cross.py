"""Shared cross positions (docs/engines.md#shared-cross-positions): a TTS row keeps the
cross-attention keys and values of its own speaker's positions only; the positions of the
speakers a voice lacks, the same in every row, are kept once. Attending to a row's positions and
the shared ones is attending to all of them (the reference parity of every token is
``test_tts_parity.py``'s)."""

from __future__ import annotations

import torch

from rtserve.engines.kyutai_tts.conditioning import MAX_SPEAKERS
from rtserve.engines.kyutai_tts.loader import load_folder
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, TTSSettings
from rtserve.engines.moshi.layers import CrossAttention, CrossKeys
from tests.engines.kyutai_tts.tiny import VOICE_FRAMES, TinyTTS

BATCH = 4


def _cross_bytes_per_row(model: KyutaiTTSModel) -> int:
    return sum((c.keys.nbytes + c.values.nbytes) // c.keys.shape[0] for c in model.lm.transformer.cross)


def test_a_row_holds_its_own_speakers_positions_and_the_padding_is_kept_once(tiny_tts: TinyTTS) -> None:
    loaded = load_folder(tiny_tts.folder, device=torch.device("cpu"), dtype=torch.float32)
    model = KyutaiTTSModel(loaded, BATCH, settings=TTSSettings(voice_frames=VOICE_FRAMES))
    young = KyutaiTTSModel(
        loaded.sharing_weights(), BATCH, settings=TTSSettings(voice_frames=VOICE_FRAMES), pre_audio_only=True
    )
    config = loaded.arch.lm
    for each in (model, young):
        for cross in each.lm.transformer.cross:
            heads, head_dim = config.num_heads, config.dim // config.num_heads
            assert cross.keys.shape == (BATCH, heads, VOICE_FRAMES, head_dim)
            assert cross.shared_keys is not None and cross.shared_values is not None
            assert cross.shared_keys.shape == (heads, (MAX_SPEAKERS - 1) * VOICE_FRAMES, head_dim)
        # A fifth of the reference layout's positions per row (one speaker slot of five).
        every_position = config.num_layers * 2 * MAX_SPEAKERS * VOICE_FRAMES * config.dim * 4
        assert _cross_bytes_per_row(each) * MAX_SPEAKERS == every_position


def test_attention_over_own_and_shared_positions_is_attention_over_all_of_them() -> None:
    torch.manual_seed(0)
    dim, heads, own, shared = 64, 4, 5, 20
    attention = CrossAttention(dim, heads)
    x = torch.randn(3, 2, dim)
    rows = torch.randn(3, own, dim)
    common = torch.randn(1, shared, dim)
    keys, values = attention.project(rows)
    shared_keys, shared_values = attention.project(common)
    split = attention(x, CrossKeys(keys, values, shared_keys[0], shared_values[0]))
    every = attention(
        x,
        CrossKeys(
            torch.cat([keys, shared_keys.expand(3, -1, -1, -1)], dim=2),
            torch.cat([values, shared_values.expand(3, -1, -1, -1)], dim=2),
        ),
    )
    torch.testing.assert_close(split, every, rtol=1e-5, atol=1e-6)
