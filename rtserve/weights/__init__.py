"""Weight settings as users write them: a local folder, ``hf://ORG/NAME[@REVISION]`` or a bare
``ORG/NAME``, resolved through ``huggingface_hub`` and its cache (docs/engines.md#hub-weights).

Engine-agnostic: an engine says which files it reads (``WeightSource.fetch``); this package
finds them in the folder, or in the hub cache, downloading what is missing with progress in
the log and on ``/health``. Every failure is a ``WeightsError``: one line, a config error.

Only ``source``, ``hub`` and ``download`` import ``huggingface_hub`` (the ``moshi`` extra); what
the server core reads (progress, errors) needs nothing beyond the standard library.
"""

from rtserve.weights.errors import WeightsError
from rtserve.weights.progress import BOARD, DownloadStatus

__all__ = ["BOARD", "DownloadStatus", "WeightsError"]
