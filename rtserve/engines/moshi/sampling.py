"""Token sampling with per-slot settings and per-slot random streams, all on the GPU.

Greedy rows take the argmax (what the parity gates pin). Sampling rows draw by an
exponential race whose noise is a counter-based hash of (slot seed, draw count, token
rank): one slot's draws never depend on how many other slots are live or what they drew
(isolation, docs/engines.md#isolation), and the whole batch samples in a fixed sequence of
kernels with no host sync, so the step can be replayed as a CUDA graph (``FrameStep``).
Per-slot settings live in ``[B]`` tensors written when a slot opens.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import torch

from rtserve.engines.moshi.fused import fused
from rtserve.engines.values import SlotSampling

_T = TypeVar("_T")


@dataclass(frozen=True)
class MoshiSampling:
    """One slot's decoding settings; ``temperature <= 0`` (or ``use_sampling=False``) is greedy."""

    use_sampling: bool = False
    temperature: float = 0.8
    top_k: int = 250
    temperature_text: float = 0.7
    top_k_text: int = 25

    @property
    def greedy(self) -> bool:
        return not self.use_sampling

    def requested(self, sampling: SlotSampling) -> MoshiSampling:
        """These defaults with a client's parameters on top. A greedy default counts as
        temperature 0 per stream, so a temperature for one stream leaves the other greedy."""
        text_temperature = self.temperature_text if self.use_sampling else 0.0
        audio_temperature = self.temperature if self.use_sampling else 0.0
        return MoshiSampling(
            use_sampling=True,
            temperature=_given(sampling.audio_temperature, audio_temperature),
            top_k=_given(sampling.audio_top_k, self.top_k),
            temperature_text=_given(sampling.text_temperature, text_temperature),
            top_k_text=_given(sampling.text_top_k, self.top_k_text),
        )


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value


# 62-bit odd multipliers (splitmix64 / PCG constants cut to fit a signed int64 once masked).
_MIX = (0x1E3779B97F4A7C15, 0x3F58476D1CE4E5B9, 0x14D049BB133111EB)
_MASK62 = (1 << 62) - 1


def _hash_uniform(seed: torch.Tensor, draw: torch.Tensor, count: int) -> torch.Tensor:
    """``[B, count]`` uniforms in (0, 1), a pure function of each row's ``seed`` and ``draw`` (``[B]`` int64).

    Products wrap modulo 2**64 and are masked to 62 bits, so every shift sees a non-negative
    value (a logical shift) on both CPU and CUDA.
    """
    index = torch.arange(count, device=seed.device, dtype=torch.int64)
    x = ((seed[:, None] * _MIX[0]) & _MASK62) ^ ((draw[:, None] * _MIX[1]) & _MASK62) ^ index * 2 + 1
    for multiplier in _MIX:
        x = ((x ^ (x >> 29)) * multiplier) & _MASK62
    return (((x >> 38) & 0xFFFFFF).float() + 0.5) / float(1 << 24)


class SlotSampler:
    """Per-row sampling state: parameters on the host (``params``) and mirrored in ``[B]`` tensors."""

    def __init__(self, batch: int, device: torch.device, default: MoshiSampling) -> None:
        self.device = device
        self.default = default
        self.params = [default] * batch
        # Per row: temperature (0: greedy) and top-k (0: whole vocabulary) of the text and audio streams.
        self.temperature = torch.zeros(2, batch, device=device)
        self.top_k = torch.zeros(2, batch, dtype=torch.int64, device=device)
        self.seed = torch.zeros(batch, dtype=torch.int64, device=device)
        self.draws = torch.zeros(batch, dtype=torch.int64, device=device)
        for slot in range(batch):
            self._write(slot, default, 0)

    def configure(self, slot: int, params: MoshiSampling | None, seed: int | None) -> None:
        self.params[slot] = params or self.default
        # An unseeded slot still gets its own stream, seeded from the OS.
        self._write(slot, self.params[slot], seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 2)

    def take_rows(self, slots: npt.NDArray[np.intp], source: SlotSampler, source_slots: npt.NDArray[np.intp]) -> None:
        """``slots`` continue ``source``'s ``source_slots`` (pairwise): their settings and random streams."""
        for slot, source_slot in zip(slots.tolist(), source_slots.tolist(), strict=True):
            self.params[slot] = source.params[source_slot]
        mine, theirs = torch.from_numpy(slots).to(self.device), torch.from_numpy(source_slots).to(self.device)
        self.temperature[:, mine] = source.temperature[:, theirs]
        self.top_k[:, mine] = source.top_k[:, theirs]
        self.seed[mine] = source.seed[theirs]
        self.draws[mine] = source.draws[theirs]

    def first_rows(self, rows: int) -> SlotSampler:
        """The first ``rows`` rows' state as views, for a step over those rows alone
        (docs/engines.md#row-buckets); slots are configured here."""
        view = copy.copy(self)
        view.params = self.params[:rows]
        view.temperature, view.top_k = self.temperature[:, :rows], self.top_k[:, :rows]
        view.seed, view.draws = self.seed[:rows], self.draws[:rows]
        return view

    def _write(self, slot: int, params: MoshiSampling, seed: int) -> None:
        greedy = params.greedy
        self.temperature[0, slot] = 0.0 if greedy else max(params.temperature_text, 0.0)
        self.temperature[1, slot] = 0.0 if greedy else max(params.temperature, 0.0)
        self.top_k[0, slot] = params.top_k_text
        self.top_k[1, slot] = params.top_k
        self.seed[slot] = seed & _MASK62
        self.draws[slot] = 0

    def sample(self, logits: torch.Tensor, text: bool) -> torch.Tensor:
        """``[B, V]`` logits -> ``[B]`` tokens; every row advances its draw counter."""
        stream = 0 if text else 1
        tokens = _draw(logits, self.temperature[stream], self.top_k[stream], self.seed, self.draws)
        self.draws.add_(1)
        return tokens


@fused
def _draw(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, seed: torch.Tensor, draws: torch.Tensor
) -> torch.Tensor:
    """Each row's token: the argmax where its temperature is 0, else a top-k draw by the race."""
    logits = logits.float()
    greedy = torch.argmax(logits, dim=-1)
    vocab = logits.shape[-1]
    # softmax(logits / T) sorted descending; ranks past the row's top-k get probability 0.
    scaled = logits / temperature.clamp(min=1e-6)[:, None]
    probs, order = torch.sort(torch.softmax(scaled, dim=-1), dim=-1, descending=True)
    top_k = torch.where(top_k > 0, top_k, vocab)
    ranks = torch.arange(vocab, device=logits.device)
    probs = torch.where(ranks[None] < top_k[:, None], probs, torch.zeros_like(probs))
    # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p.
    race = probs / -torch.log(_hash_uniform(seed, draws, vocab))
    drawn = order.gather(1, race.argmax(dim=-1, keepdim=True))[:, 0]
    return torch.where(temperature > 0, drawn, greedy)
