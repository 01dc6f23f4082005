"""A Piper voice on onnxruntime, and the frames the voice sandbox speaks in.

The built-in voice runs in the server (``engines/cascade/tts.py``); voices users upload run
in a sandbox child process (``engines/cascade/voice_sandbox.py`` starts it,
``processes/voice_sandbox.py`` is its entry point). Both load voices with ``PiperModel``.
This module stays out of the cascade package, which imports aiohttp, pydantic and the
config, so the child starts with numpy, onnxruntime and piper only.

Audio comes out one Piper sentence at a time (``chunks``), so whoever speaks can stop as
soon as the audio is longer than its bound instead of producing all of it first.

A frame on the sandbox's pipes is a 4-byte big-endian length and a JSON header, then the
raw bytes the header announces (``payload_bytes``). JSON rather than pickle: the parent
never unpickles what a process running an untrusted model wrote.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from rtserve.codecs.pcm import FloatArray

_LENGTH = struct.Struct(">I")
_MAX_HEADER_BYTES = 1 << 20
# Piper phonemizes with espeak-ng, one process-wide state (its voice is set, then read): one
# thread at a time. The model runs outside it, so TTS lanes speak in parallel.
_PHONEMIZER = threading.Lock()


class PiperModel:
    """One Piper ``.onnx`` voice and its ``.onnx.json`` config, on ``cpu_threads`` threads."""

    def __init__(self, model_path: Path, cpu_threads: int) -> None:
        import onnxruntime
        from piper.config import PiperConfig
        from piper.voice import PiperVoice

        config = PiperConfig.from_dict(json.loads(Path(f"{model_path}.json").read_text(encoding="utf-8")))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = cpu_threads
        options.inter_op_num_threads = 1
        # No busy-waiting between ops: the LLM decodes on the same cores while a reply's first
        # piece is synthesized, and spinning threads slowed that piece by ~45% (2 cores: 404 ms
        # -> 276 ms for "The capital of France is Paris." with the LLM decoding; alone 261 -> 209 ms).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # PiperVoice.load() would use onnxruntime's default (all cores): build it with our bound.
        session = onnxruntime.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._voice = PiperVoice(session=session, config=config)
        self.sample_rate: int = config.sample_rate

    def chunks(self, sentence: str, speed: float) -> Iterator[FloatArray]:
        """The sentence's audio at ``sample_rate``, one piece per sentence Piper finds in it."""
        from piper.config import SynthesisConfig

        config = SynthesisConfig(length_scale=self._voice.config.length_scale / speed)
        with _PHONEMIZER:
            sentences = self._voice.phonemize(sentence)
        for phonemes in sentences:
            if phonemes:  # as PiperVoice.synthesize: audio peak-normalized (its default), clipped
                audio = self._voice.phoneme_ids_to_audio(self._voice.phonemes_to_ids(phonemes), config)
                assert isinstance(audio, np.ndarray)  # without alignments: the audio alone
                peak = float(np.max(np.abs(audio))) if audio.size else 0.0
                audio = audio / peak if peak >= 1e-8 else np.zeros_like(audio)
                yield np.clip(audio, -1.0, 1.0).astype(np.float32)


def write_frame(stream: IO[bytes], header: dict[str, Any], payload: bytes = b"") -> None:
    raw = json.dumps({**header, "payload_bytes": len(payload)}).encode()
    stream.write(_LENGTH.pack(len(raw)) + raw + payload)
    stream.flush()


def read_frame(stream: IO[bytes], max_payload: int) -> tuple[dict[str, Any], bytes] | None:
    """The next frame, or None at end of stream (the other side closed or died)."""
    prefix = _read_exactly(stream, _LENGTH.size)
    if prefix is None:
        return None
    (length,) = _LENGTH.unpack(prefix)
    if length > _MAX_HEADER_BYTES:
        raise ValueError(f"voice sandbox frame header of {length} bytes")
    raw = _read_exactly(stream, length)
    if raw is None:
        return None
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("voice sandbox frame header is not an object")
    size = header.get("payload_bytes", 0)
    if not isinstance(size, int) or not 0 <= size <= max_payload:
        raise ValueError(f"voice sandbox frame payload of {size} bytes")
    payload = _read_exactly(stream, size)
    return None if payload is None else (header, payload)


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        piece = stream.read(size - len(data))
        if not piece:
            return None
        data += piece
    return bytes(data)
