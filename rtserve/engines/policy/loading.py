"""``config.robot.policy`` -> a ``PolicyEngine``.

* ``demo`` — the built-in DROID demo network.
* a path to a TorchScript file (an existing file, or a ``.pt``/``.pth``/``.ts`` name).
* ``package.module:factory`` — a zero-argument callable returning a ``PolicyEngine``
  (``rtserve.engines.protocols``). Its ``infer`` returns one dict per request holding
  numpy arrays or plain msgpack values (no tensors); float arrays must be finite.

Torch is imported only by the branch that needs it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import cast

from rtserve.config import RobotConfig
from rtserve.engines.policy.errors import PolicyLoadError
from rtserve.engines.protocols import PolicyEngine

_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
_REQUIRED_METHODS = ("server_config", "validate", "infer", "reset")


def _check_policy(policy: object, origin: str) -> PolicyEngine:
    missing = [name for name in _REQUIRED_METHODS if not callable(getattr(policy, name, None))]
    if missing:
        raise PolicyLoadError(
            f"robot.policy {origin!r} returned {type(policy).__name__}, "
            f"which lacks PolicyEngine method(s): {', '.join(missing)}"
        )
    return cast(PolicyEngine, policy)  # every PolicyEngine method is there (checked above)


def _load_entry_point(spec: str) -> PolicyEngine:
    module_name, attr_path = spec.split(":")
    try:
        target: object = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except (ImportError, AttributeError) as exc:
        raise PolicyLoadError(f"robot.policy {spec!r} cannot be imported: {exc}") from None
    if not callable(target):
        raise PolicyLoadError(f"robot.policy {spec!r} is not callable")
    return _check_policy(target(), spec)


def _limit_torch_threads(threads: int | None) -> None:
    # Process-wide: on a small CPU host, fewer intra-op threads than cores leaves one
    # for the event loop instead of OpenMP workers spinning against it.
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def load_policy(config: RobotConfig) -> PolicyEngine:
    """Build the configured policy (blocking: call it off the event loop)."""
    spec = config.policy
    if spec == "demo":
        _limit_torch_threads(config.torch_threads)
        from rtserve.engines.policy.demo import DemoDroidPolicy

        return DemoDroidPolicy(max_sessions=config.max_sessions)
    if Path(spec).is_file() or spec.endswith(_TORCHSCRIPT_SUFFIXES):
        if not Path(spec).is_file():
            raise PolicyLoadError(f"robot.policy: TorchScript file {spec!r} does not exist")
        from rtserve.engines.policy.torchscript import TorchScriptPolicy

        _limit_torch_threads(config.torch_threads)
        return TorchScriptPolicy(spec)
    if _ENTRY_POINT.match(spec):
        return _load_entry_point(spec)
    raise PolicyLoadError(f"robot.policy {spec!r} is neither 'demo', a TorchScript file, nor 'module:factory'")
