"""A ``diffusers`` pipeline from a weight setting: a local folder (``save_pretrained`` layout,
``model_index.json`` at its top) or a hub repo id, on the configured device and dtype
(docs/engines.md#diffusion-weights).

A hub repo's ``model_index.json`` is fetched through ``rtserve.weights`` first, so a missing,
gated or offline repo fails with the same one-line ``WeightsError`` as every other engine; the
component files then come from ``DiffusionPipeline.download`` (the same hub cache, offline when
``HF_HUB_OFFLINE`` is set), which picks the weight files the pipeline needs (safetensors, no duplicates).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffusers import DiffusionPipeline

from rtserve.config import ConfigError, DiffusionEngineConfig, ServerConfig
from rtserve.engines.model_builds import MODEL_BUILDS
from rtserve.engines.torch_device import resolve_device
from rtserve.engines.torch_dtypes import DTYPES
from rtserve.weights import WeightsError, hub
from rtserve.weights.source import HubRepo, open_source


def pipeline_folder(weights: str, field: str, config: ServerConfig) -> Path:
    """The local folder holding the pipeline ``weights`` names (downloaded into the hub cache if needed)."""
    source = open_source(weights, field, progress_interval_s=config.weights.progress_interval_s)
    index = source.file("model_index.json", "the diffusers pipeline layout")
    if not isinstance(source.root, HubRepo):
        return index.parent
    repo = source.root
    try:
        return Path(
            DiffusionPipeline.download(
                repo.repo_id, revision=repo.revision, cache_dir=hub.cache_dir(), local_files_only=hub.offline()
            )
        )
    except (OSError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"{repo}: cannot fetch the pipeline's components: {detail}") from None


def load_pipeline(settings: DiffusionEngineConfig, field: str, config: ServerConfig) -> Any:
    """The pipeline ``settings.weights`` names, moved to ``settings.device`` in ``settings.dtype``."""
    if not settings.weights:
        raise ConfigError(f"invalid config field {field!r}: no weights set")
    device = resolve_device(settings.device, field.rsplit(".", 1)[0] + ".device")
    folder = pipeline_folder(settings.weights, field, config)
    try:
        with MODEL_BUILDS:  # diffusers makes the dtype torch's process-wide default while it builds
            pipe = DiffusionPipeline.from_pretrained(folder, dtype=DTYPES[settings.dtype])  # type: ignore[no-untyped-call]
    except (OSError, ValueError, KeyError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"{settings.weights} ({field}): not a loadable diffusers pipeline: {detail}") from None
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
