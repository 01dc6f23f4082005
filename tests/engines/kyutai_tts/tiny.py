"""A tiny random Kyutai TTS checkpoint in Kyutai's format, plus the reference ``TTSModel``.

The reference ``moshi`` package builds the LM with its conditioners (``get_moshi_lm`` with
the published config keys: demultiplexed lookahead text stream, low-rank depformer
embeddings, cross-attention on the voice, ``control``/``cfg`` lookup tables); the weights
are perturbed and saved as Kyutai publishes them (stacked attention projections).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tests.engines.moshi.tiny import MIMI_CONFIG, reference_mimi, save_kyutai_folder

TEXT_CARD = 64
CARD = 32
VOICE_DIM = 16
VOICE_FRAMES = 6
SUFFIX = ".tinytts@7.safetensors"
CFG_VALUES = ["1.0", "1.5", "2.0", "2.5", "3.0"]

LM_KWARGS: dict[str, Any] = {
    "dim": 32,
    "text_card": TEXT_CARD,
    "existing_text_padding_id": 3,
    "n_q": 8,
    "dep_q": 8,
    "card": CARD,
    "num_heads": 4,
    "num_layers": 2,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 50,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 16,
    "depformer_dim_feedforward": int(4.125 * 16),
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "depformer_weights_per_step_schedule": [0, 1, 2, 2, 3, 3, 3, 3],
    "depformer_low_rank_embeddings": 8,
    "demux_second_stream": True,
    "cross_attention": True,
    "delays": [0, 0, 2, 2, 2, 2, 2, 2, 2],
}


def conditioners(distilled: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "speaker_wavs": {"type": "tensor", "tensor": {"dim": VOICE_DIM}},
        "control": {
            "type": "lut",
            "lut": {"n_bins": 4, "dim": 8, "tokenizer": "noop", "possible_values": ["ok", "bad"]},
        },
    }
    if distilled:
        out["cfg"] = {"type": "lut", "lut": {"n_bins": 8, "dim": 8, "tokenizer": "noop", "possible_values": CFG_VALUES}}
    return out


def fuser(distilled: bool) -> dict[str, Any]:
    return {
        "sum": ["control", "cfg"] if distilled else ["control"],
        "cross": ["speaker_wavs"],
        "cross_attention_pos_emb": True,
        "cross_attention_pos_emb_scale": 1.0,
    }


TTS_CONFIG = {"audio_delay": 0.4, "second_stream_ahead": 2}  # 5 frames at 12.5 Hz


@dataclass
class TinyTTS:
    folder: Path
    voices: Path
    lm: Any  # moshi.models.lm.LMModel
    mimi: Any  # moshi.models.compression.MimiModel
    raw: dict[str, Any]


def reference_tts_lm(raw: dict[str, Any], seed: int = 0) -> Any:
    from moshi.models.loaders import get_moshi_lm

    torch.manual_seed(seed)
    lm_kwargs = {k: copy.deepcopy(v) for k, v in raw.items() if k not in ("tts_config", "model_id", "model_type")}
    model = get_moshi_lm(None, lm_kwargs=lm_kwargs, device="cpu", dtype=torch.float32).float().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
        # Make "new word" (0) and "pad" (3) the text head's frequent winners, so greedy decoding
        # walks the state machine both ways instead of only being forced by max_padding.
        model.text_linear.weight[[0, 3]] *= 4.0
    return model


def write_voice(path: Path, seed: int, frames: int = VOICE_FRAMES) -> None:
    generator = torch.Generator().manual_seed(seed)
    save_file({"speaker_wavs": torch.randn(1, VOICE_DIM, frames, generator=generator)}, str(path))


def write_tts_checkpoint(folder: Path, *, distilled: bool = True) -> TinyTTS:
    folder.mkdir(parents=True, exist_ok=True)
    raw = dict(
        LM_KWARGS,
        conditioners=conditioners(distilled),
        fuser=fuser(distilled),
        tts_config=TTS_CONFIG,
        model_id={"sig": "tinytts", "epoch": 7},
        model_type="tts",
    )
    lm = reference_tts_lm(raw)
    mimi = reference_mimi(MIMI_CONFIG)
    save_tts_checkpoint(folder, lm, mimi, raw=raw, mimi_config=MIMI_CONFIG)
    voices = folder / "voices"
    voices.mkdir()
    write_voice(voices / f"alice{SUFFIX}", 1)
    write_voice(voices / f"bob{SUFFIX}", 2)
    return TinyTTS(folder, voices, lm, mimi, raw)


def save_tts_checkpoint(folder: Path, lm: Any, mimi: Any, *, raw: dict[str, Any], mimi_config: dict[str, Any]) -> None:
    """``lm`` (a reference TTS ``LMModel``) and ``mimi`` as Kyutai publishes a TTS folder (``raw``:
    its config.json keys), with a small trained SentencePiece tokenizer."""
    save_kyutai_folder(folder, lm, mimi, config=raw, mimi_config=mimi_config)


def reference_tts(tiny: TinyTTS, *, cfg_coef: float = 1.0, n_q: int = 8) -> Any:
    """The reference ``TTSModel`` around the same LM and Mimi, greedy, generating ``n_q`` codebooks
    (fewer than the LM's: on a copy of the LM, whose ``dep_q`` the reference lowers for good)."""
    import sentencepiece
    from moshi.models.tts import StateMachine, TokenIds, TTSModel

    lm = tiny.lm if n_q == tiny.lm.n_q else copy.deepcopy(tiny.lm)
    return TTSModel(
        lm=lm,
        mimi=tiny.mimi,
        tokenizer=sentencepiece.SentencePieceProcessor(str(tiny.folder / "tokenizer.model")),
        voice_suffix=SUFFIX,
        voice_repo="",
        machine=StateMachine(TokenIds(lm.text_card + 1), second_stream_ahead=2, max_padding=8, initial_padding=2),
        delay_steps=5,
        temp=0.0,
        cfg_coef=cfg_coef,
        n_q=n_q,
        final_padding=4,
    )
