"""Load a Kyutai STT checkpoint with the Moshi loader (docs/engines.md#kyutai-stt-engine).

The folder (or hub repo) is the Moshi layout: ``config.json`` naming the LM, Mimi and the
tokenizer, with ``dep_q: 0`` (no depformer), ``extra_heads_*`` and ``stt_config``. Anything
else that would load as a Moshi model is refused here, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

import sentencepiece
import torch

from rtserve.config import WeightsConfig
from rtserve.engines.kyutai_stt.settings import SttSettings
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.engines.moshi.loader import LoadedModel, load_files
from rtserve.engines.moshi.weights import resolve
from rtserve.weights.source import WeightSource


@dataclass
class SttModel:
    loaded: LoadedModel
    settings: SttSettings
    tokenizer: sentencepiece.SentencePieceProcessor


def stt_model(loaded: LoadedModel) -> SttModel:
    """``loaded`` checked to be a listener, with its ``stt_config`` read."""
    config = loaded.lm_config
    if config.dep_q:
        raise CheckpointError(
            f"config.json: dep_q={config.dep_q}: a speech-to-text checkpoint has no depformer (dep_q 0); "
            "this one speaks (serve it with moshi_engine)"
        )
    if not loaded.extras.stt_config:
        raise CheckpointError("config.json: no stt_config (the audio delay of a speech-to-text checkpoint)")
    if loaded.tokenizer is None:
        raise CheckpointError("a speech-to-text checkpoint needs its text tokenizer (tokenizer_name)")
    settings = SttSettings.from_config(loaded.extras.stt_config, loaded.mimi_config.frame_rate, config.max_delay)
    return SttModel(loaded, settings, loaded.tokenizer)


def load_stt(source: WeightSource, weights: WeightsConfig, *, device: torch.device, dtype: torch.dtype) -> SttModel:
    """Resolve (maybe download) and load; blocking. ``CheckpointError`` / ``WeightsError`` name the fault."""
    return stt_model(load_files(resolve(source, weights), device=device, dtype=dtype))
