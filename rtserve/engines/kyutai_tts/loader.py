"""Load a Kyutai TTS checkpoint from a local folder (docs/engines.md#kyutai-tts): the Moshi
loader's file resolution, Mimi and tokenizer, with the TTS LM and its fp32 conditioners."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import sentencepiece
import torch

from rtserve.config import WeightsConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.conditioning import Conditioners, conditioner_rename
from rtserve.engines.kyutai_tts.config import TTSArch
from rtserve.engines.kyutai_tts.lm import TTSLM, tts_rename
from rtserve.engines.model_builds import MODEL_BUILDS
from rtserve.engines.moshi.checkpoint import load_into, read_safetensors
from rtserve.engines.moshi.lm_config import CheckpointError, MimiConfig
from rtserve.engines.moshi.loader import load_mimi, load_tokenizer
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.row_views import sharing_weights
from rtserve.engines.moshi.weights import MoshiFiles, resolve
from rtserve.errors import INVALID_VALUE
from rtserve.weights import WeightsError
from rtserve.weights.source import WeightSource

log = logging.getLogger(__name__)


@dataclass
class LoadedTTS:
    lm: TTSLM
    conditioners: Conditioners
    mimi: Mimi
    tokenizer: sentencepiece.SentencePieceProcessor
    arch: TTSArch
    mimi_config: MimiConfig
    folder: Path | None

    def sharing_weights(self) -> LoadedTTS:
        """The same weights with an LM whose streaming state is this copy's own (for a model
        that never decodes: the Mimi codec's state stays shared)."""
        return replace(self, lm=sharing_weights(self.lm))


def load_files(
    files: MoshiFiles, *, device: torch.device, dtype: torch.dtype, codebooks: int | None = None
) -> LoadedTTS:
    """``codebooks``: audio codebooks to generate and decode (default: all the LM has)."""
    assert files.weights is not None
    if files.extras.model_type != "tts":
        raise CheckpointError(f"config.json: model_type={files.extras.model_type!r}, expected 'tts'")
    arch = TTSArch.from_dict(files.raw)
    mimi_config = MimiConfig.from_dict(files.mimi_raw)
    if mimi_config.bins != arch.lm.card:
        raise CheckpointError(f"Mimi has {mimi_config.bins} bins per codebook but the LM card is {arch.lm.card}")
    codebooks = arch.lm.n_q if codebooks is None else codebooks
    if not 1 <= codebooks <= arch.lm.n_q:  # a setting this checkpoint refuses, as cfg_coef's are
        raise EngineError(
            f"codebooks={codebooks}: this checkpoint generates at most {arch.lm.n_q} audio codebooks",
            code=INVALID_VALUE,
        )
    path = files.weights["moshi_name"]
    log.info("loading kyutai TTS LM from %s (%s, %s)", path, device, dtype)
    tensors = read_safetensors(path)
    with MODEL_BUILDS:  # its modules make tensors in torch's default dtype
        with torch.device("meta"):
            lm = TTSLM(arch)
            conditioners = Conditioners(arch)
        lm.to_empty(device=device)
        load_into(lm, tensors, path, tts_rename(arch), dtype=dtype)
        conditioners.to_empty(device=device)
        load_into(conditioners, tensors, path, conditioner_rename, dtype=torch.float32)
        mimi = load_mimi(mimi_config, codebooks, files.weights["mimi_name"], device)
    tokenizer = load_tokenizer(files.weights["tokenizer_name"], arch.lm.text_card)
    return LoadedTTS(
        lm.eval().requires_grad_(False),
        conditioners.eval().requires_grad_(False),
        mimi,
        tokenizer,
        arch,
        mimi_config,
        files.folder,
    )


def load_folder(
    folder: str | Path, *, device: torch.device, dtype: torch.dtype, codebooks: int | None = None
) -> LoadedTTS:
    """A local weight folder in Kyutai's layout (``config.json`` with ``model_type: tts``)."""
    source = WeightSource(Path(folder), "tts_engine.weights", progress_interval_s=WeightsConfig().progress_interval_s)
    try:
        files = resolve(source, WeightsConfig())
    except WeightsError as exc:
        raise CheckpointError(str(exc)) from None
    return load_files(files, device=device, dtype=dtype, codebooks=codebooks)
