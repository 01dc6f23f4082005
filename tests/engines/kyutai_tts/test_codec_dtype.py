"""The Mimi decoder in bf16 (``tts_engine.codec_dtype``; docs/engines.md#mimi-decoder-in-bf16):
the decoder feeds nothing back to the model, so every stream says exactly the fp32 model's
tokens, and its audio stays within the stated budget of the fp32 decoder's: 30 dB SNR (41.6 dB
measured on the tiny checkpoint on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtserve.engines.kyutai_tts.loader import load_folder
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, TTSSettings
from rtserve.engines.kyutai_tts.voices import VoiceFolder
from rtserve.weights.source import WeightSource
from tests.engines.kyutai_tts.test_pre_audio_steps import DEVICES, start
from tests.engines.kyutai_tts.tiny import VOICE_DIM, VOICE_FRAMES, TinyTTS

SNR_BUDGET_DB = 30.0


def model(tiny: TinyTTS, device: str, codec_dtype: torch.dtype) -> KyutaiTTSModel:
    loaded = load_folder(tiny.folder, device=torch.device(device), dtype=torch.float32)
    loaded.mimi.decoder_to(codec_dtype)
    settings = TTSSettings(temperature=0.8, cfg_coef=2.0, voice_frames=VOICE_FRAMES)
    voices = VoiceFolder(
        WeightSource(tiny.voices, "voices", progress_interval_s=1), loaded.arch.voice_suffix, VOICE_DIM, VOICE_FRAMES
    )
    return KyutaiTTSModel(loaded, 2, settings=settings, voices=voices)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_decoder_says_the_same_tokens_and_keeps_the_audio_within_budget(tiny_tts: TinyTTS, device: str) -> None:
    fp32, bf16 = model(tiny_tts, device, torch.float32), model(tiny_tts, device, torch.bfloat16)
    for each in (fp32, bf16):
        start(each, 0, "alice", seed=7)
        start(each, 1, "bob", seed=3)
    heard: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {0: ([], []), 1: ([], [])}
    for _ in range(60):
        ours, theirs = bf16.step(), fp32.step()
        for slot, (reference, tested) in heard.items():
            a, b = theirs[slot], ours[slot]
            assert a is not None and b is not None
            assert (a.codes is None) == (b.codes is None) and (a.audio is None) == (b.audio is None)
            if a.codes is not None and b.codes is not None:
                np.testing.assert_array_equal(a.codes, b.codes)
            if a.audio is not None and b.audio is not None:
                assert b.audio.dtype == np.float32
                reference.append(a.audio)
                tested.append(b.audio)
    for reference, tested in heard.values():
        x, y = np.concatenate(reference), np.concatenate(tested)
        assert x.size >= 30 * 1920 and np.abs(x).max() > 0
        snr_db = 10 * np.log10(np.sum(x**2) / np.sum((x - y) ** 2))
        assert snr_db >= SNR_BUDGET_DB, snr_db
