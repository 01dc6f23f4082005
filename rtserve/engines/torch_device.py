"""The torch device a ``device`` setting names, checked against what this process's torch sees."""

from __future__ import annotations

import torch

from rtserve.config import ConfigError


def resolve_device(spec: str | torch.device, field: str) -> torch.device:
    """The device ``spec`` names, pinned to an index; ``auto``: CUDA when present, else the CPU.

    ``field`` is the setting's dotted name, so a ``ConfigError`` says which setting to change.
    """
    where = f"invalid config field {field!r}"
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"{where}: {str(spec)!r} is not a torch device name") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"{where}: {str(spec)!r} is not supported (use 'cpu', 'cuda' or 'cuda:N')")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"{where}: {str(spec)!r} was requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); "
            f"set it to 'cpu' or run where a CUDA GPU and a CUDA build of torch are present"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"{where}: {str(spec)!r} was requested but only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    return torch.device("cuda", index)
