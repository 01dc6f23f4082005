"""Serve a TorchScript policy file.

Contract for the file (documented for users exporting their own policy):

* ``forward(obs: Dict[str, Tensor]) -> Tensor``: every array key of the observation
  spec, stacked along a new first (batch) dimension; returns ``[B, ...]`` actions.
* An extra file ``rtserve_policy.json`` saved with the module
  (``torch.jit.save(m, path, _extra_files={"rtserve_policy.json": ...})``) holding
  ``{"server_config": {...}, "observation": {key: {"shape": [...], "dtype": "float32"}},
  "action_key": "actions"}``. ``dtype`` is optional (any numeric dtype, cast to float32).

TorchScript modules are stateless here: ``reset`` has nothing to clear.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rtserve.engines.policy.errors import PolicyLoadError
from rtserve.engines.policy.observation_spec import ArraySpec, describe_spec, validate_observation
from rtserve.engines.values import PolicyRequest

METADATA_FILE = "rtserve_policy.json"


def _parse_metadata(path: Path, raw: str) -> tuple[dict[str, Any], dict[str, ArraySpec], str]:
    if not raw:
        raise PolicyLoadError(
            f"robot.policy: TorchScript file {path} has no '{METADATA_FILE}' extra file "
            "(save it with torch.jit.save(..., _extra_files=...))"
        )
    try:
        meta = json.loads(raw)
        spec = {
            key: ArraySpec(tuple(int(d) for d in field["shape"]), dtype=field.get("dtype"))
            for key, field in meta["observation"].items()
        }
        server_config = dict(meta.get("server_config", {}))
        action_key = str(meta.get("action_key", "actions"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PolicyLoadError(f"robot.policy: '{METADATA_FILE}' in {path} is invalid: {exc}") from None
    return server_config, spec, action_key


class TorchScriptPolicy:
    """``PolicyEngine`` over a ``torch.jit`` module: one forward per batch."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        extra = {METADATA_FILE: ""}
        try:
            # torch leaves jit.load unannotated.
            self._module: torch.jit.ScriptModule = torch.jit.load(  # type: ignore[no-untyped-call]
                str(self._path), map_location="cpu", _extra_files=extra
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise PolicyLoadError(
                f"robot.policy: cannot load TorchScript file {self._path}: {exc}".splitlines()[0]
            ) from None
        self._module.eval()
        self._server_config, self._spec, self._action_key = _parse_metadata(self._path, extra[METADATA_FILE])

    def server_config(self) -> dict[str, Any]:
        return {**self._server_config, "observation_spec": describe_spec(self._spec)}

    def validate(self, observation: dict[str, Any]) -> None:
        validate_observation(self._spec, observation)

    def infer(self, batch: Sequence[PolicyRequest]) -> list[dict[str, Any]]:
        inputs = {
            key: torch.from_numpy(np.stack([request.observation[key] for request in batch]).astype(np.float32))
            for key in self._spec
        }
        with torch.inference_mode():
            actions = self._module(inputs)
        if not isinstance(actions, torch.Tensor) or actions.shape[:1] != (len(batch),):
            raise RuntimeError(f"TorchScript policy returned {type(actions).__name__} without a batch dimension")
        rows = actions.detach().float().numpy()
        return [{self._action_key: row.copy()} for row in rows]

    def reset(self, session_id: str) -> None:
        """Stateless: nothing to forget."""
