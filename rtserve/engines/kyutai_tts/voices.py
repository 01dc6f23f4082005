"""Voices of a Kyutai TTS engine: pre-computed voice embeddings (``*.safetensors`` holding
``speaker_wavs`` ``[1, dim, T]``, as kyutai/tts-voices publishes them) in one folder
(docs/engines.md#kyutai-tts).

A voice name is a path relative to the folder, with or without the checkpoint's suffix
(``.{sig}@{epoch}.safetensors``) or ``.safetensors``; it must stay inside the folder.
Everything is checked when the name is resolved, before a slot is taken.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.conditioning import Voice, voice_layout
from rtserve.errors import INVALID_VOICE, VOICE_NOT_FOUND

_CACHE_SIZE = 64


class VoiceError(EngineError):
    code = VOICE_NOT_FOUND


class VoiceFolder:
    def __init__(self, folder: Path | None, suffix: str, dim: int, max_frames: int) -> None:
        self.folder = None if folder is None else folder.resolve()
        self.suffix = suffix
        self.dim = dim
        self.max_frames = max_frames
        self._cache: OrderedDict[Path, Voice] = OrderedDict()

    def in_folder(self, folder: Path | None) -> VoiceFolder:
        """The same voice layout, read from ``folder``."""
        return VoiceFolder(folder, self.suffix, self.dim, self.max_frames)

    def names(self) -> list[str]:
        """Every voice name in the folder (files ending with the checkpoint's suffix, else ``.safetensors``)."""
        if self.folder is None:
            return []
        ending = self.suffix or ".safetensors"
        return sorted(
            str(path.relative_to(self.folder))[: -len(ending)]
            for path in self.folder.rglob(f"*{ending}")
            if path.is_file()
        )

    def resolve(self, name: str) -> Path:
        if self.folder is None:
            raise VoiceError("this server has no voices configured", param="voice")
        endings = [e for e in (self.suffix, ".safetensors", "") if e] if not name.endswith(".safetensors") else [""]
        for ending in endings:
            path = (self.folder / (name + ending)).resolve()
            if not path.is_relative_to(self.folder):
                raise VoiceError("voice must name a file inside the voice folder", param="voice")
            if path.is_file():
                return path
        raise VoiceError(f"unknown voice {name!r}", param="voice")

    def load(self, name: str) -> Voice:
        path = self.resolve(name)
        cached = self._cache.get(path)
        if cached is not None:
            self._cache.move_to_end(path)
            return cached
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError):
            raise VoiceError(f"voice {name!r} is not a readable safetensors file", code=INVALID_VOICE) from None
        embedding = tensors.get("speaker_wavs")
        if embedding is None or embedding.dim() != 3 or embedding.shape[0] != 1 or embedding.shape[1] != self.dim:
            raise VoiceError(f"voice {name!r} must hold speaker_wavs of shape [1, {self.dim}, T]", code=INVALID_VOICE)
        if not 0 < embedding.shape[2] <= self.max_frames or not embedding.dtype.is_floating_point:
            raise VoiceError(
                f"voice {name!r} must hold 1 to {self.max_frames} float frames (has {embedding.shape[2]})",
                code=INVALID_VOICE,
            )
        if not torch.isfinite(embedding).all():
            raise VoiceError(f"voice {name!r} holds non-finite values", code=INVALID_VOICE)
        voice = voice_layout([embedding])
        self._cache[path] = voice
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return voice
