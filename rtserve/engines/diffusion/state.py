"""The seam between the step batcher and a diffusion model (docs/engines.md#diffusion-step-batching).

The batcher owns scheduling (queue, admission, cancellation, progress); a ``StepModel`` owns
the tensors. A request becomes a ``StepState`` once prepared; states with equal ``key`` can be
stepped by one batched denoiser call, whatever step each is at and however many steps each runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

R_contra = TypeVar("R_contra", contravariant=True)
S = TypeVar("S", bound="StepState")
O = TypeVar("O")  # noqa: E741  # invariant: a list of them is returned


@dataclass(eq=False)
class StepState:
    """One request's denoising state; models subclass it with their tensors."""

    key: Hashable  # equal keys: one batched denoiser call may step them together
    steps_total: int
    steps_done: int = 0  # advanced by the model's ``step``

    @property
    def finished(self) -> bool:
        return self.steps_done >= self.steps_total


class StepModel(Protocol[R_contra, S, O]):
    """What the batcher drives, on its engine thread only."""

    def prepare(self, request: R_contra) -> S:
        """Encode the request (prompts, images, first latents, its own scheduler). An
        ``RtserveError`` raised here fails this request only."""
        ...

    def step(self, states: Sequence[S]) -> None:
        """One batched denoising step of ``states`` (equal keys, none finished); each
        state's ``steps_done`` goes up by one."""
        ...

    def finish(self, states: Sequence[S]) -> list[O]:
        """The outputs of finished ``states`` (equal keys), in order."""
        ...
