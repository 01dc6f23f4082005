"""The TTS conditioners (docs/engines.md#kyutai-tts): what a voice and the CFG strength become.

A Kyutai TTS LM is conditioned two ways, both fixed for a whole utterance:

* summed into every step's input: ``control`` and ``cfg``, lookup tables keyed by a short
  string (``cfg`` is the CFG strength of a CFG-distilled checkpoint, e.g. ``"2.0"``; None
  is the "no value" padding);
* attended to by every temporal layer: ``speaker_wavs``, a voice embedding of up to
  ``MAX_SPEAKERS`` speakers x T frames, projected to the LM width, with a sinusoidal position
  added (``fuser.cross_attention_pos_emb``).

Positions without a value (a missing speaker, a None LUT value) become the conditioner's
learnt padding. Conditioners run in fp32 whatever the LM's dtype, as the reference keeps them.
Everything here runs once per slot opening, off the per-frame path.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import torch
from torch import nn

from rtserve.engines.kyutai_tts.config import ConditionerSpec, TTSArch

MAX_SPEAKERS = 5
_PREFIX = re.compile(r"^condition_provider\.conditioners\.")


class Conditioner(nn.Module):
    def __init__(self, spec: ConditionerSpec, output_dim: int) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.n_bins + 1, spec.dim) if spec.kind == "lut" else None
        self.output_proj: nn.Module = (
            nn.Linear(spec.dim, output_dim, bias=False)
            if spec.force_linear or spec.dim != output_dim
            else nn.Identity()
        )
        self.learnt_padding = nn.Parameter(torch.zeros(1, 1, output_dim)) if spec.learn_padding else None

    def index(self, value: str | None) -> int:
        """A LUT value's row: its place among the possible values, else its hash; None: padding."""
        spec = self.spec
        if value is None:
            return spec.n_bins
        if spec.possible_values is None:
            return int(hashlib.sha256(value.encode("utf-8")).hexdigest(), 16) % spec.n_bins
        if value not in spec.possible_values:
            raise ValueError(f"{value!r} is not one of {spec.name}'s values {list(spec.possible_values)}")
        return spec.possible_values.index(value)

    def forward(self, condition: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[1, T, dim]`` (LUT: ``[1, T]`` rows) and ``[1, T]`` bool -> ``[1, T, output_dim]``."""
        if self.embed is not None:
            condition = self.embed(condition)
        out: torch.Tensor = self.output_proj(condition)
        maskf = mask.float()[..., None]
        if self.learnt_padding is None:
            return out * maskf
        return out * maskf + self.learnt_padding * (1 - maskf)


class Conditioners(nn.Module):
    """The checkpoint's conditioners and how the fuser combines them."""

    def __init__(self, arch: TTSArch) -> None:
        super().__init__()
        self.arch = arch
        dim = arch.lm.dim
        self.conditioners = nn.ModuleDict({spec.name: Conditioner(spec, dim) for spec in arch.conditioners})

    def _get(self, name: str) -> Conditioner:
        module = self.conditioners[name]
        assert isinstance(module, Conditioner)
        return module

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def lut(self, name: str, value: str | None) -> torch.Tensor:
        conditioner = self._get(name)
        device = self._device()
        index = torch.tensor([[conditioner.index(value)]], device=device)
        out: torch.Tensor = conditioner(index, torch.tensor([[value is not None]], device=device))
        return out

    @torch.no_grad()
    def summed(self, values: dict[str, str | None]) -> torch.Tensor | None:
        """``[1, 1, dim]`` fp32: the fuser's ``sum`` conditions for these LUT values (None: no sum)."""
        fuser = self.arch.fuser
        total: torch.Tensor | None = None
        for name in () if fuser is None else fuser.sum:
            condition = self.lut(name, values.get(name))
            total = condition if total is None else total + condition
        return total

    @torch.no_grad()
    def cross(self, voice: Voice | None, length: int) -> torch.Tensor:
        """``[1, length, dim]`` fp32: the cross-attention source for ``voice`` (None: the null
        voice, all padding), padded to ``length`` positions."""
        fuser = self.arch.fuser
        assert fuser is not None and len(fuser.cross) == 1
        conditioner = self._get(fuser.cross[0])
        device = self._device()
        tensor = torch.zeros(1, length, conditioner.spec.dim, device=device)
        mask = torch.zeros(1, length, dtype=torch.bool, device=device)
        if voice is not None:
            frames = voice.frames.shape[0]
            tensor[0, :frames] = voice.frames.to(device)
            mask[0, :frames] = voice.mask.to(device)
        cross: torch.Tensor = conditioner(tensor, mask)
        if fuser.cross_pos_emb:
            cross = cross + fuser.cross_pos_emb_scale * sin_embedding(length, cross.shape[-1], device)
        return cross


def sin_embedding(length: int, dim: int, device: torch.device, max_period: float = 10_000) -> torch.Tensor:
    """``[1, length, dim]``: cosines then sines of ``position / max_period ** (i / (dim/2 - 1))``."""
    half = dim // 2
    positions = torch.arange(length, device=device, dtype=torch.float32).view(1, -1, 1)
    scale = torch.arange(half, device=device, dtype=torch.float32).view(1, 1, -1)
    phase = positions / (torch.full([], max_period, device=device) ** (scale / (half - 1)))
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)


def conditioner_rename(key: str) -> str | None:
    """Checkpoint names -> ``Conditioners`` names (only the conditioners' tensors)."""
    if not _PREFIX.match(key):
        return None
    return "conditioners." + _PREFIX.sub("", key)


@dataclass(frozen=True)
class Voice:
    """A voice as the cross conditioner takes it: ``frames`` ``[S, dim]`` fp32 and ``mask`` ``[S]``."""

    frames: torch.Tensor
    mask: torch.Tensor


def voice_layout(speakers: list[torch.Tensor]) -> Voice:
    """Voice embeddings (each ``[1, dim, T]`` as published, ``speaker_wavs``) -> ``MAX_SPEAKERS``
    speaker slots of T frames each, the missing speakers masked, as the reference lays them out."""
    frames = speakers[0].shape[2]
    out = torch.zeros(MAX_SPEAKERS, frames, speakers[0].shape[1])
    mask = torch.zeros(MAX_SPEAKERS, frames, dtype=torch.bool)
    for index, embedding in enumerate(speakers[:MAX_SPEAKERS]):
        out[index] = embedding[0].transpose(0, 1).float()
        mask[index] = True
    return Voice(out.view(MAX_SPEAKERS * frames, -1), mask.view(-1))
