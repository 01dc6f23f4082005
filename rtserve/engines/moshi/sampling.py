"""Token sampling with per-slot settings and per-slot random generators.

Greedy rows take the argmax (what the parity gates pin). Sampling rows draw through their
own ``torch.Generator`` so one slot's draws never depend on how many other slots are live
or on what they drew (isolation, design.md "Frame engine").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

import torch

from rtserve.engines.protocols import SlotSampling

_T = TypeVar("_T")


@dataclass(frozen=True)
class SamplingParams:
    """One slot's decoding settings; ``temperature <= 0`` (or ``use_sampling=False``) is greedy."""

    use_sampling: bool = False
    temperature: float = 0.8
    top_k: int = 250
    temperature_text: float = 0.7
    top_k_text: int = 25

    @property
    def greedy(self) -> bool:
        return not self.use_sampling

    def requested(self, sampling: SlotSampling) -> SamplingParams:
        """These defaults with a client's parameters on top. A greedy default counts as
        temperature 0 per stream, so a temperature for one stream leaves the other greedy."""
        text_temperature = self.temperature_text if self.use_sampling else 0.0
        audio_temperature = self.temperature if self.use_sampling else 0.0
        return SamplingParams(
            use_sampling=True,
            temperature=_given(sampling.audio_temperature, audio_temperature),
            top_k=_given(sampling.audio_top_k, self.top_k),
            temperature_text=_given(sampling.text_temperature, text_temperature),
            top_k_text=_given(sampling.text_top_k, self.top_k_text),
        )


def _given(value: _T | None, default: _T) -> _T:
    return default if value is None else value


class SlotSampler:
    """Per-row sampling state: parameters and generators, indexed by slot."""

    def __init__(self, batch: int, device: torch.device, default: SamplingParams) -> None:
        self.device = device
        self.default = default
        self.params = [default] * batch
        self.generators = [torch.Generator(device=device) for _ in range(batch)]

    def configure(self, slot: int, params: SamplingParams | None, seed: int | None) -> None:
        self.params[slot] = params or self.default
        # An unseeded slot still gets its own generator, seeded from the OS.
        self.generators[slot].manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)

    def sample(self, logits: torch.Tensor, text: bool) -> torch.Tensor:
        """``[B, V]`` logits -> ``[B]`` tokens."""
        tokens = torch.argmax(logits.float(), dim=-1)
        for row, params in enumerate(self.params):
            if params.greedy:
                continue
            temperature = params.temperature_text if text else params.temperature
            top_k = params.top_k_text if text else params.top_k
            if temperature <= 0:
                continue
            tokens[row] = self._draw(logits[row].float(), temperature, top_k, self.generators[row])
        return tokens

    @staticmethod
    def _draw(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> torch.Tensor:
        probs = torch.softmax(logits / temperature, dim=-1)
        indices: torch.Tensor | None = None
        if top_k > 0:
            probs, indices = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) draws from p without a host sync.
        race = probs / torch.empty_like(probs).exponential_(1, generator=generator)
        choice = race.argmax(dim=-1)
        return choice if indices is None else indices[choice]
