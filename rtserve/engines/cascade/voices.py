"""Piper voices registered at run time (``POST /v1/audio/voices``): checked, stored, listed.

A voice is a Piper ``.onnx`` model and its ``.onnx.json`` config, stored flat in
``voices.dir`` as ``<name>.onnx`` + ``<name>.onnx.json``; names are one safe path component
(``engines/voice_names.py``), so none can leave the folder. An upload is written to a
private temporary folder inside ``voices.dir``, proven (the config parses with sane values,
the model loads with Piper and speaks a word of finite, non-silent audio) and only then
renamed into place, so a half-written or broken voice is never listed. Every method here
blocks (file I/O, model loading): callers run it off the event loop.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtserve import untrusted_json
from rtserve.codecs.pcm import FloatArray
from rtserve.config import VoiceStoreConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.values import VoiceInfo
from rtserve.engines.voice_names import check_voice_name, is_voice_name
from rtserve.errors import INVALID_VOICE_MODEL, REQUEST_TOO_LARGE, VOICE_EXISTS, VOICE_LIMIT_EXCEEDED, VOICE_NOT_FOUND

_MIN_RATE, _MAX_RATE = 8_000, 48_000  # what Piper voices are trained at, with room both ways


class VoiceUploadError(EngineError):
    code = INVALID_VOICE_MODEL


def check_config(raw: bytes) -> dict[str, Any]:
    """The parsed Piper config, or ``VoiceUploadError`` saying what is wrong with it."""
    try:
        config = untrusted_json.loads(raw)
    except ValueError:
        raise VoiceUploadError("the voice config is not valid JSON", param="config") from None
    if not isinstance(config, dict):
        raise VoiceUploadError("the voice config must be a JSON object", param="config")
    from piper.config import PiperConfig

    try:
        parsed = PiperConfig.from_dict(config)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise VoiceUploadError(
            f"the voice config is not a Piper config (missing or bad field {exc})", param="config"
        ) from None
    if not isinstance(parsed.sample_rate, int) or not _MIN_RATE <= parsed.sample_rate <= _MAX_RATE:
        raise VoiceUploadError(f"audio.sample_rate must be an integer in [{_MIN_RATE}, {_MAX_RATE}]", param="config")
    if not isinstance(parsed.num_symbols, int) or parsed.num_symbols <= 0 or not parsed.phoneme_id_map:
        raise VoiceUploadError("num_symbols and phoneme_id_map must describe the model's symbols", param="config")
    for key in ("length_scale", "noise_scale", "noise_w_scale"):
        value = getattr(parsed, key)
        if not isinstance(value, (int, float)) or not 0 < value <= 10:
            raise VoiceUploadError(f"inference.{key} must be a number in (0, 10]", param="config")
    return config


@dataclass(frozen=True)
class StoredVoice:
    info: VoiceInfo
    model_path: Path


class VoiceStore:
    """The registered voices of one folder. Thread-safe: uploads run off the TTS thread."""

    def __init__(self, config: VoiceStoreConfig) -> None:
        self._config = config
        self._folder = Path(config.dir).expanduser()
        self._lock = threading.Lock()
        self._voices: dict[str, StoredVoice] = {}
        if self._folder.is_dir():
            for model in sorted(self._folder.glob("*.onnx")):
                if is_voice_name(model.stem) and Path(f"{model}.json").is_file():
                    self._voices[model.stem] = self._describe(model.stem, model)

    def get(self, name: str) -> StoredVoice | None:
        with self._lock:
            return self._voices.get(name)

    def list(self) -> list[VoiceInfo]:
        with self._lock:
            return [voice.info for voice in self._voices.values()]

    def add(
        self, name: str, model: bytes, config: bytes, *, reserved: frozenset[str], prove: Callable[[Path], FloatArray]
    ) -> StoredVoice:
        """Store a new voice once ``prove(model_path)`` made it speak; raises a typed ``EngineError``."""
        check_voice_name(name)
        if name in reserved:
            raise EngineError(f"voice name {name!r} is taken by a built-in voice", code=VOICE_EXISTS, param="name")
        if len(model) > self._config.max_model_bytes or len(config) > self._config.max_config_bytes:
            raise EngineError(
                "the voice upload is larger than voices.max_model_bytes / max_config_bytes", code=REQUEST_TOO_LARGE
            )
        check_config(config)
        with self._lock:
            self._check_room(name)
        self._folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".upload-", dir=self._folder))
        try:
            model_path = staging / f"{name}.onnx"
            model_path.write_bytes(model)
            Path(f"{model_path}.json").write_bytes(config)
            try:
                audio = prove(model_path)
            except EngineError:
                raise  # the proof's own verdict: a sandbox limit breached, or the model does not load or speak
            except Exception:  # noqa: BLE001 - any failure to load or run the upload is the upload's fault
                raise VoiceUploadError("the voice model does not load or speak with Piper", param="model") from None
            if audio.size == 0 or not np.all(np.isfinite(audio)) or float(np.max(np.abs(audio))) == 0.0:
                raise VoiceUploadError("the voice model produced no usable audio", param="model")
            with self._lock:
                self._check_room(name)  # another upload of the same name may have finished meanwhile
                final = self._folder / f"{name}.onnx"
                Path(f"{model_path}.json").replace(f"{final}.json")
                model_path.replace(final)
                stored = self._voices[name] = self._describe(name, final)
            return stored
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def remove(self, name: str) -> None:
        with self._lock:
            stored = self._voices.pop(name, None)
        if stored is None:
            raise EngineError(f"no registered voice named {name!r}", code=VOICE_NOT_FOUND, param="name")
        stored.model_path.unlink(missing_ok=True)
        Path(f"{stored.model_path}.json").unlink(missing_ok=True)

    def _check_room(self, name: str) -> None:
        if name in self._voices:
            raise EngineError(
                f"a voice named {name!r} is already registered; delete it first", code=VOICE_EXISTS, param="name"
            )
        if len(self._voices) >= self._config.max_voices:
            raise EngineError(
                f"at most {self._config.max_voices} voices can be registered (voices.max_voices)",
                code=VOICE_LIMIT_EXCEEDED,
            )

    @staticmethod
    def _describe(name: str, model: Path) -> StoredVoice:
        stat = model.stat()
        info = VoiceInfo(
            name=name,
            builtin=False,
            sample_rate=sample_rate_of(model),
            file_size=stat.st_size,
            created_at=int(stat.st_mtime),
        )
        return StoredVoice(info, model)


def sample_rate_of(model: Path) -> int:
    """The sample rate a stored (or staged) model's checked ``.onnx.json`` config declares."""
    config = json.loads(Path(f"{model}.json").read_text(encoding="utf-8"))
    return int(config["audio"]["sample_rate"])
