"""Which files a Moshi-class checkpoint is made of, in the layouts Kyutai and NVIDIA publish
(docs/engines.md#hub-weights); ``rtserve.weights`` finds or downloads them.

* ``config.json`` first. It names the LM (``moshi_name``), Mimi (``mimi_name``), the text
  tokenizer (``tokenizer_name``) and optionally a Mimi config (``mimi_config_name``); any of
  them may be ``hf://ORG/NAME[@REV]/PATH`` in another repo. ``model_type``, ``lm_gen_config``
  and ``stt_config`` are kept for the engine.
* Without ``config.json``, the older layout: the published Moshi 7B with the default names.
* PersonaPlex adds ``voices.tgz``, its voice prompts (``.pt`` embeddings): unpacked once into
  ``voices/`` beside it (in a hub snapshot: the snapshot folder, where PersonaPlex's own server
  puts them), bounded by ``weights.max_archive_*``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtserve.config import WeightsConfig
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.weights.archive import unpack_once
from rtserve.weights.errors import WeightsError
from rtserve.weights.source import WeightSource

CONFIG_NAME = "config.json"
VOICES_ARCHIVE = "voices.tgz"
DEFAULT_NAMES = {
    "moshi_name": "model.safetensors",
    "mimi_name": "tokenizer-e351c8d8-checkpoint125.safetensors",
    "tokenizer_name": "tokenizer_spm_32k_3.model",
}


@dataclass(frozen=True)
class CheckpointExtras:
    """What a Kyutai ``config.json`` says beyond the LM's shape, kept for the engine."""

    model_type: str = "moshi"
    lm_gen_config: dict[str, Any] = field(default_factory=dict)
    stt_config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MoshiFiles:
    """A checkpoint's parsed configs and local file paths (weights None: shapes only)."""

    label: str  # the folder or hf://ORG/NAME@REV, for messages
    raw: dict[str, Any]  # config.json ({} for the older layout)
    mimi_raw: dict[str, Any] | None
    extras: CheckpointExtras
    weights: dict[str, Path] | None  # DEFAULT_NAMES' keys -> paths
    voices: Path | None  # unpacked voice prompts (PersonaPlex)
    folder: Path | None  # the local folder, None for a hub repo


def read_json(path: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"cannot read {name}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{name} must hold a JSON object")
    return data


def _name(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key, DEFAULT_NAMES.get(key))
    if not isinstance(value, str) or not value:
        raise CheckpointError(f"config.json: {key} must be a file name")
    return value


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise CheckpointError(f"config.json: {key} must be an object")
    return value


def resolve(source: WeightSource, settings: WeightsConfig, *, with_weights: bool = True) -> MoshiFiles:
    """The checkpoint's files, fetched; ``with_weights=False`` fetches the configs only (the
    shape for ``moshi_engine.random_weights``)."""
    config_path = source.fetch({CONFIG_NAME: "the checkpoint's layout"}, optional={CONFIG_NAME})[CONFIG_NAME]
    raw = {} if config_path is None else read_json(config_path, f"{source.label}/{CONFIG_NAME}")
    if raw.get("lora_name"):
        raise CheckpointError(f"config.json: lora_name={raw['lora_name']!r}: LoRA weights are not supported")
    model_type = raw.get("model_type", "moshi")
    if not isinstance(model_type, str):
        raise CheckpointError("config.json: model_type must be a string")
    extras = CheckpointExtras(model_type, _section(raw, "lm_gen_config"), _section(raw, "stt_config"))
    mimi_raw = None
    if raw.get("mimi_config_name"):
        mimi_name = _name(raw, "mimi_config_name")
        mimi_raw = read_json(source.file(mimi_name, "config.json mimi_config_name"), mimi_name)
    weights = voices = None
    if with_weights:
        names = {key: _name(raw, key) for key in DEFAULT_NAMES}
        wanted = {name: f"config.json {key}" for key, name in names.items()}
        wanted[VOICES_ARCHIVE] = "PersonaPlex voice prompts"
        found = source.fetch(wanted, optional={VOICES_ARCHIVE})
        weights = {key: path for key, name in names.items() if (path := found[name]) is not None}
        archive = found[VOICES_ARCHIVE]
        if archive is not None:
            voices = unpack_once(
                archive,
                archive.parent / "voices",
                max_bytes=settings.max_archive_bytes,
                max_members=settings.max_archive_members,
            )
    return MoshiFiles(source.label, raw, mimi_raw, extras, weights, voices, source.folder)


def fetch_all(source: WeightSource, settings: WeightsConfig) -> None:
    """``rtserve download --engine moshi``: every file ``serve`` reads (``rtserve.weights.download``)."""
    try:
        resolve(source, settings)
    except CheckpointError as exc:  # a config.json the engine could not read: the same one line
        raise WeightsError(str(exc)) from None
