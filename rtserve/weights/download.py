"""``rtserve download WEIGHTS --engine NAME``: fetch ahead of time what ``serve`` would, as
``huggingface-cli download`` does, but only the files that engine reads.

Each engine names its own "which files" function here (imported only when asked for, like the
engine registry does), so this package stays free of any engine's code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from rtserve.config import WeightsConfig
from rtserve.weights.errors import WeightsError
from rtserve.weights.source import WeightSource, open_source

# engine name -> "module:function"; function(source, settings) fetches every file the engine reads.
FILE_SETS: dict[str, str] = {
    "moshi": "rtserve.engines.moshi.weights:fetch_all",
}


def download(weights: str, engine: str, settings: WeightsConfig) -> Path:
    """The local folder the engine will read: the hub snapshot folder for a repo."""
    try:
        module_name, function_name = FILE_SETS[engine].split(":")
    except KeyError:
        raise WeightsError(f"engine {engine!r} has no weights to download (known: {', '.join(FILE_SETS)})") from None
    fetch_all: Callable[[WeightSource, WeightsConfig], None] = getattr(
        importlib.import_module(module_name), function_name
    )
    source = open_source(weights, "weights", progress_interval_s=settings.progress_interval_s)
    fetch_all(source, settings)
    assert source.local_root is not None  # a fetch of the repo's own files sets it
    return source.local_root
