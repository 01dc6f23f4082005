"""Mimi in bf16 for Moshi (``moshi_engine.encoder_dtype`` / ``decoder_dtype``;
docs/engines.md#mimi-in-bf16-for-moshi): the decoder in bf16 feeds nothing back, so every slot
says exactly the fp32 model's words and its audio stays within 30 dB SNR of the fp32 decoder's
(41.6 dB measured on the tiny checkpoint on CPU); the settings reach the served model."""

from __future__ import annotations

import numpy as np
import torch

from rtserve.config import ServerConfig
from rtserve.engines.moshi.engine import build_frame_model
from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.loader import load_folder
from rtserve.engines.moshi.sampling import MoshiSampling
from rtserve.engines.values import FrameOutput, SlotPrompt
from tests.engines.moshi.tiny import TinyCheckpoint

SNR_BUDGET_DB = 30.0
TICKS = 40


def _conversation(tiny: TinyCheckpoint, decoder_dtype: torch.dtype) -> list[list[FrameOutput | None]]:
    loaded = load_folder(tiny.folder, device=torch.device("cpu"), dtype=torch.float32)
    loaded.mimi.decoder_to(decoder_dtype)
    model = MoshiFrameModel(loaded, 2, sampling=MoshiSampling(use_sampling=False))
    for slot in range(2):
        model.open_slot(slot, SlotPrompt())
    heard = (0.3 * np.random.default_rng(5).standard_normal((TICKS, 2, model.frame_size))).astype(np.float32)
    return [model.step(heard[tick], np.ones(2, bool)) for tick in range(TICKS)]


def test_a_bf16_decoder_keeps_every_word_and_the_audio_within_budget(tiny: TinyCheckpoint) -> None:
    fp32, bf16 = _conversation(tiny, torch.float32), _conversation(tiny, torch.bfloat16)
    for slot in range(2):
        ours = [tick[slot] for tick in bf16]
        theirs = [tick[slot] for tick in fp32]
        assert all(frame is not None for frame in ours + theirs)
        assert [f.text for f in ours if f] == [f.text for f in theirs if f]
        x = np.concatenate([f.audio for f in theirs if f])
        y = np.concatenate([f.audio for f in ours if f])
        assert y.dtype == np.float32 and np.abs(x).max() > 0
        snr_db = 10 * np.log10(np.sum(x**2) / np.sum((x - y) ** 2))
        assert snr_db >= SNR_BUDGET_DB, snr_db


def test_the_codec_settings_reach_the_served_model(moshi_config: ServerConfig) -> None:
    settings = moshi_config.moshi_engine.model_copy(update={"encoder_dtype": "bfloat16", "decoder_dtype": "bfloat16"})
    model = build_frame_model(moshi_config.model_copy(update={"moshi_engine": settings}))
    mimi = model.mimi
    assert {
        p.dtype for part in (mimi.encoder, mimi.downsample, mimi.decoder, mimi.upsample) for p in part.parameters()
    } == {torch.bfloat16}
    model.open_slot(0, SlotPrompt())
    out = model.step(np.zeros((2, model.frame_size), np.float32), np.array([True, False]))[0]
    assert out is not None and out.audio.dtype == np.float32 and np.isfinite(out.audio).all()
