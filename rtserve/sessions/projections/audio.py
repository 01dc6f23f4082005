"""Float32 agent audio -> the base64 payload of an audio delta in the session's format.
Sample-rate conversion happens before (the runner resamples to the output rate)."""

from __future__ import annotations

import base64

from rtserve.codecs import g711
from rtserve.codecs.pcm import FloatArray, float_to_f32le, float_to_pcm16
from rtserve.sessions.session_config import AudioFormat


def encode_audio_b64(pcm: FloatArray, audio_format: AudioFormat) -> str:
    if audio_format == "pcm16":
        raw = float_to_pcm16(pcm)
    elif audio_format == "pcm_f32le":
        raw = float_to_f32le(pcm)
    elif audio_format == "g711_ulaw":
        raw = g711.encode("ulaw", pcm)
    elif audio_format == "g711_alaw":
        raw = g711.encode("alaw", pcm)
    else:  # SessionConfig validation makes this unreachable
        raise ValueError(f"unsupported output audio format {audio_format!r}")
    return base64.b64encode(raw).decode("ascii")
