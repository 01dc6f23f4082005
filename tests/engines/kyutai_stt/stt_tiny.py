"""A tiny random Kyutai STT checkpoint written as Kyutai publishes one (docs/engines.md#kyutai-stt-engine).

The reference ``moshi`` package builds the LM with ``dep_q=0`` (no depformer) and extra heads;
its weights, the tiny Mimi and a SentencePiece tokenizer are saved in the Moshi layout with a
``config.json`` carrying ``stt_config`` and ``model_type: stt``, so our loader reads what a
real folder holds. The padding rows of the text head are scaled up so a random model says
padding often and words now and then, as a trained one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.engines.moshi.tiny import LM_KWARGS, reference_lm, reference_mimi, save_kyutai_folder

STT_LM_KWARGS: dict[str, Any] = dict(
    LM_KWARGS,
    n_q=8,
    dep_q=0,
    delays=[0] + [1] * 8,
    extra_heads_num_heads=3,
    extra_heads_dim=6,
)
STT_CONFIG = {"audio_delay_seconds": 0.5, "audio_silence_prefix_seconds": 0.5}
PADDING_BOOST = 3.0
END_PADDING_MIX = 1.0


@dataclass
class TinyStt:
    folder: Path
    lm: Any  # moshi.models.lm.LMModel, dep_q=0
    mimi: Any  # moshi.models.compression.MimiModel


def write_stt_checkpoint(folder: Path, *, lm_kwargs: dict[str, Any] = STT_LM_KWARGS) -> TinyStt:
    lm = reference_lm(lm_kwargs, seed=7)
    lean_to_padding(lm, lm_kwargs["existing_text_padding_id"])
    mimi = reference_mimi()
    from tests.engines.moshi.tiny import MIMI_CONFIG

    save_stt_checkpoint(folder, lm, mimi, lm_kwargs=lm_kwargs, stt_config=STT_CONFIG, mimi_config=MIMI_CONFIG)
    return TinyStt(folder, lm, mimi)


def lean_to_padding(lm: Any, padding: int, end_padding: int = 0) -> None:
    """Scale the text head so the random model says padding often and words now and then."""
    with torch.no_grad():
        weight = lm.text_linear.weight
        weight[padding] *= PADDING_BOOST
        # The end of padding leans on the padding direction, so it wins where padding nearly does.
        weight[end_padding] = END_PADDING_MIX * weight[padding] + weight[end_padding]


def save_stt_checkpoint(
    folder: Path,
    lm: Any,
    mimi: Any,
    *,
    lm_kwargs: dict[str, Any],
    stt_config: dict[str, float],
    mimi_config: dict[str, Any],
) -> None:
    """``lm`` (a reference ``LMModel``, dep_q 0) and ``mimi`` as Kyutai publishes an STT folder,
    with a small trained SentencePiece tokenizer."""
    config = dict(lm_kwargs, model_type="stt", stt_config=stt_config)
    save_kyutai_folder(folder, lm, mimi, config=config, mimi_config=mimi_config)
