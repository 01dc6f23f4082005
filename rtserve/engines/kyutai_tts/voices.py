"""Voices of a Kyutai TTS engine: pre-computed voice embeddings (``*.safetensors`` holding
``speaker_wavs`` ``[1, dim, T]``, as kyutai/tts-voices publishes them) in one folder or one
hub repo (docs/engines.md#kyutai-tts).

A voice name is a path relative to the folder, with or without the checkpoint's suffix
(``.{sig}@{epoch}.safetensors``) or ``.safetensors``; it must stay inside the folder. A hub
repo's voice is fetched into the hub cache the first time a stream asks for it (the repo holds
hundreds; a server uses a few). Everything is checked when the name is resolved, before a slot
is taken.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.conditioning import Voice, voice_layout
from rtserve.errors import INVALID_VOICE, MODEL_UNAVAILABLE, VOICE_NOT_FOUND
from rtserve.weights import hub
from rtserve.weights.errors import WeightsError
from rtserve.weights.source import HubRepo, WeightSource, safe_name

_CACHE_SIZE = 64


class VoiceError(EngineError):
    code = VOICE_NOT_FOUND


class VoiceFolder:
    def __init__(self, source: WeightSource | None, suffix: str, dim: int, max_frames: int) -> None:
        """``source``: the folder or hub repo of ``tts_engine.voices``; None: no voices."""
        self.source = source
        self.folder = None if source is None or source.folder is None else source.folder.resolve()
        self.suffix = suffix
        self.dim = dim
        self.max_frames = max_frames
        self._cache: OrderedDict[Path, Voice] = OrderedDict()
        # Streams open from worker threads; the lock covers the cache only, so a voice being
        # fetched from the hub or read does not hold up another stream's cached one.
        self._cache_lock = threading.Lock()

    def at(self, source: WeightSource | None) -> VoiceFolder:
        """The same voice layout, read from ``source``."""
        return VoiceFolder(source, self.suffix, self.dim, self.max_frames)

    def names(self) -> list[str]:
        """Every voice name (files ending with the checkpoint's suffix, else ``.safetensors``);
        blocking: a hub repo's list comes from the hub (offline: what its cached snapshot holds)."""
        ending = self.suffix or ".safetensors"
        if self.folder is not None:
            files = [str(path.relative_to(self.folder)) for path in self.folder.rglob(f"*{ending}") if path.is_file()]
        elif self.source is not None and isinstance(self.source.root, HubRepo):
            try:
                files = hub.list_files(self.source.root.repo_id, self.source.root.revision)
            except WeightsError as exc:
                raise EngineError(f"cannot list the voices: {exc}", code=MODEL_UNAVAILABLE) from None
        else:
            return []
        return sorted(name[: -len(ending)] for name in files if name.endswith(ending))

    def resolve(self, name: str) -> Path:
        """The voice's file (a hub repo's: downloaded into the cache when not there yet)."""
        if self.source is None:
            raise VoiceError("this server has no voices configured", param="voice")
        endings = [e for e in (self.suffix, ".safetensors", "") if e] if not name.endswith(".safetensors") else [""]
        if self.folder is None:
            return self._fetch(self.source, [name + ending for ending in endings], name)
        for ending in endings:
            path = (self.folder / (name + ending)).resolve()
            if not path.is_relative_to(self.folder):
                raise VoiceError("voice must name a file inside the voice folder", param="voice")
            if path.is_file():
                return path
        raise VoiceError(f"unknown voice {name!r}", param="voice")

    @staticmethod
    def _fetch(source: WeightSource, candidates: list[str], name: str) -> Path:
        try:
            for candidate in candidates:
                safe_name(candidate, "tts_engine.voices")
        except WeightsError:
            raise VoiceError("voice must name a file inside the voice folder", param="voice") from None
        for candidate in candidates:  # in order: the checkpoint's suffix first, as in a folder
            try:
                found = source.fetch({candidate: f"voice {name!r}"}, optional=[candidate])[candidate]
            except WeightsError as exc:
                raise EngineError(f"cannot fetch voice {name!r}: {exc}", code=MODEL_UNAVAILABLE) from None
            if found is not None:
                return found
        raise VoiceError(f"unknown voice {name!r}", param="voice")

    def load(self, name: str) -> Voice:
        path = self.resolve(name)
        with self._cache_lock:
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
        with self._cache_lock:
            self._cache[path] = voice
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return voice
