"""PersonaPlex conditioning: voice prompts and persona text, turned into prefill steps.

A slot opened with a prompt replays it through the normal batched step, one frame per
tick (docs/engines.md#prompts): each prefill
step forces that row's output tokens (and, for embedding voices, its temporal input), so
the slot's caches end up exactly as if the model had produced the prompt itself.

* voice ``.pt``: a tensor ``[T, dim]`` (or a dict with ``"embeddings"``) of temporal
  input embeddings, one per step;
* voice audio (``.wav`` or anything PyAV decodes): Mimi codes of the agent speaking,
  forced on the agent codebooks with the acoustic delays applied, text forced to PAD;
* persona text: ``<system> text <system>`` SentencePiece tokens forced on the text stream
  while the agent codebooks are forced to silence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.moshi.lm_config import LMConfig
from rtserve.errors import INVALID_PROMPT

SYSTEM_TAG = "<system>"


class PromptError(EngineError):
    code = INVALID_PROMPT


@dataclass(frozen=True)
class PrefillStep:
    """One forced step: ``tokens[k]`` is used where ``mask[k]`` (k = 0 text, 1.. depformer codebooks)."""

    tokens: npt.NDArray[np.int64]  # [1 + dep_q]
    mask: npt.NDArray[np.bool_]  # [1 + dep_q]
    embedding: torch.Tensor | None = None  # [dim] temporal input replacing the token embeddings


def load_voice_embeddings(path: Path, dim: int, max_steps: int) -> torch.Tensor:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file; all mean "not a voice"
        raise PromptError(f"voice prompt {path.name} is not a readable tensor file: {type(exc).__name__}") from None
    if isinstance(data, dict):
        data = data.get("embeddings")
    if not isinstance(data, torch.Tensor) or not data.dtype.is_floating_point:
        raise PromptError(f"voice prompt {path.name} must hold a float tensor (or a dict with 'embeddings')")
    data = data.reshape(-1, data.shape[-1]) if data.dim() >= 2 else data
    if data.dim() != 2 or data.shape[1] != dim:
        raise PromptError(f"voice prompt {path.name} has shape {tuple(data.shape)}, expected [steps, {dim}]")
    if not 0 < data.shape[0] <= max_steps:
        raise PromptError(f"voice prompt {path.name} has {data.shape[0]} steps (1..{max_steps} allowed)")
    return data.float()


def load_voice_audio(path: Path, sample_rate: int, max_seconds: float) -> FloatArray:
    """Mono float32 at ``sample_rate``, decoded and resampled with PyAV."""
    import av  # a core dependency (codecs); imported here to keep module import light

    chunks: list[FloatArray] = []
    try:
        with av.open(str(path)) as container:
            resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
            # format="flt": float32 frames (no copy in astype).
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().astype(np.float32, copy=False).reshape(-1))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().astype(np.float32, copy=False).reshape(-1))
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise PromptError(f"voice prompt {path.name} is not a decodable audio file: {exc}") from None
    pcm = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if pcm.size == 0:
        raise PromptError(f"voice prompt {path.name} holds no audio")
    if pcm.size > max_seconds * sample_rate:
        raise PromptError(f"voice prompt {path.name} is longer than {max_seconds:g} s")
    return pcm


def audio_steps(codes: npt.NDArray[np.int64], silence: npt.NDArray[np.int64], config: LMConfig) -> list[PrefillStep]:
    """Force the agent codebooks to ``codes`` (``[frames, agent]``) with the acoustic delays applied."""
    agent = config.agent_codebooks
    frames = codes.shape[0]
    steps = []
    for step in range(frames + config.max_delay):
        tokens = np.zeros(1 + config.dep_q, np.int64)
        mask = np.zeros(1 + config.dep_q, bool)
        tokens[0], mask[0] = config.text_padding_id, True
        for k in range(agent):
            source = step - config.delays[1 + k]
            tokens[1 + k] = codes[source, k] if 0 <= source < frames else silence[k]
            mask[1 + k] = True
        steps.append(PrefillStep(tokens, mask))
    return steps


def text_steps(token_ids: list[int], silence: npt.NDArray[np.int64], config: LMConfig) -> list[PrefillStep]:
    steps = []
    for token in token_ids:
        tokens = np.zeros(1 + config.dep_q, np.int64)
        mask = np.zeros(1 + config.dep_q, bool)
        tokens[0], mask[0] = token, True
        tokens[1 : 1 + config.agent_codebooks] = silence
        mask[1 : 1 + config.agent_codebooks] = True
        steps.append(PrefillStep(tokens, mask))
    return steps


def embedding_steps(embeddings: torch.Tensor, config: LMConfig) -> list[PrefillStep]:
    empty = np.zeros(1 + config.dep_q, np.int64)
    return [PrefillStep(empty, np.zeros(1 + config.dep_q, bool), row) for row in embeddings]


def persona_tokens(text: str, encode: object, max_tokens: int) -> list[int]:
    """``<system> text <system>`` as token ids; longer personas are refused, not truncated."""
    assert callable(encode)
    wrapped = f"{SYSTEM_TAG} {text.strip()} {SYSTEM_TAG}"
    ids = [int(i) for i in encode(wrapped)]
    if len(ids) > max_tokens:
        raise PromptError(f"persona text is {len(ids)} tokens long, more than the {max_tokens} allowed")
    return ids
