"""Declarative observation schemas, checked per request before anything is batched.

A policy describes each key it reads; ``validate_observation`` turns the first mismatch
into an ``InvalidObservation`` whose message names the key, so a client learns exactly
what to fix and a malformed request never reaches a batch shared with other robots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rtserve.engines.policy.errors import InvalidObservation

# dtype kinds a numeric tensor may arrive in: bool, signed, unsigned, float.
NUMERIC_KINDS = "biuf"


@dataclass(frozen=True)
class ArraySpec:
    """An ndarray of exactly ``shape``; ``dtype`` pins the dtype, else any of ``kinds``.
    Float values must be finite unless ``finite`` is False (a NaN joint reading would
    otherwise come back as NaN actions, found only after the batched call)."""

    shape: tuple[int, ...]
    dtype: str | None = None
    kinds: str = NUMERIC_KINDS
    finite: bool = True

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, np.ndarray):
            raise InvalidObservation(f"observation key '{key}' must be a numpy array, got {type(value).__name__}")
        if self.dtype is not None and value.dtype != np.dtype(self.dtype):
            raise InvalidObservation(f"observation key '{key}' must have dtype {self.dtype}, got {value.dtype}")
        if value.dtype.kind not in self.kinds:
            raise InvalidObservation(f"observation key '{key}' must be numeric, got dtype {value.dtype}")
        if value.shape != self.shape:
            raise InvalidObservation(
                f"observation key '{key}' must have shape {list(self.shape)}, got {list(value.shape)}"
            )
        if self.finite and value.dtype.kind == "f" and not np.isfinite(value).all():
            raise InvalidObservation(f"observation key '{key}' holds NaN or infinite values")

    def describe(self) -> dict[str, Any]:
        return {"type": "ndarray", "shape": list(self.shape), "dtype": self.dtype or f"kinds:{self.kinds}"}


@dataclass(frozen=True)
class TextSpec:
    """A string of at most ``max_chars`` characters."""

    max_chars: int = 1024

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, str):
            raise InvalidObservation(f"observation key '{key}' must be a string, got {type(value).__name__}")
        if len(value) > self.max_chars:
            raise InvalidObservation(f"observation key '{key}' is longer than {self.max_chars} characters")

    def describe(self) -> dict[str, Any]:
        return {"type": "str", "max_chars": self.max_chars}


FieldSpec = ArraySpec | TextSpec
ObservationSpec = Mapping[str, FieldSpec]


def validate_observation(spec: ObservationSpec, observation: Mapping[str, Any]) -> None:
    """Raise ``InvalidObservation`` for the first missing or mis-shaped key; extra keys pass."""
    for key, field_spec in spec.items():
        if key not in observation:
            raise InvalidObservation(f"missing observation key '{key}'")
        field_spec.check(key, observation[key])


def describe_spec(spec: ObservationSpec) -> dict[str, dict[str, Any]]:
    """The schema in plain types, for the handshake so clients can build observations."""
    return {key: field_spec.describe() for key, field_spec in spec.items()}
