"""Client audio of the realtime routes: base64 in a wire format -> float32 at the engine rate.

One ``InputAudioDecoder`` per connection. It keeps a streaming resampler (filter state
across appends), so a stream cut into arbitrary appends reaches the engine as one
continuous signal. The resampler holds back a few tens of ms; ``flush`` returns that
tail at a turn boundary (commit) so no spoken audio is lost, ``reset`` drops it (clear).

Wire formats (OpenAI Realtime names plus the duplex extension ``pcm_f32le``):
``pcm16`` little-endian int16 and ``pcm_f32le`` float32, both 24 kHz unless an append
names its own ``sample_rate_hz``; ``g711_ulaw`` / ``g711_alaw`` at 8 kHz.
"""

from __future__ import annotations

import numpy as np

from rtserve.codecs import g711
from rtserve.codecs.errors import InvalidAudioError
from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray, b64_decode, f32le_to_float, pcm16_to_float
from rtserve.codecs.resample import StreamResampler
from rtserve.sessions.session_config import G711_RATE, AudioFormat

PCM_RATE = WIRE_SAMPLE_RATE  # OpenAI Realtime pcm16 is 24 kHz mono
MIN_RATE, MAX_RATE = 8000, 192000

_EMPTY = np.zeros(0, dtype=np.float32)


def default_rate(audio_format: AudioFormat) -> int:
    return G711_RATE if audio_format.startswith("g711") else PCM_RATE


def decode_samples(raw: bytes, audio_format: AudioFormat) -> FloatArray:
    """Wire bytes -> float32 samples at the format's own rate (raises ``CodecError``)."""
    if audio_format == "pcm16":
        return pcm16_to_float(raw)
    if audio_format == "pcm_f32le":
        return f32le_to_float(raw)
    return g711.decode("ulaw" if audio_format == "g711_ulaw" else "alaw", raw)


class InputAudioDecoder:
    def __init__(self, engine_rate: int) -> None:
        self.engine_rate = engine_rate
        self._key: tuple[AudioFormat, int] | None = None
        self._resampler: StreamResampler | None = None

    def decode(self, payload: str, audio_format: AudioFormat, sample_rate: int | None = None) -> FloatArray:
        """One append's base64 ``payload`` -> engine-rate samples (possibly fewer than sent:
        the resampler holds some back). Raises ``CodecError`` for bad base64 or samples."""
        rate = sample_rate or default_rate(audio_format)
        if audio_format.startswith("g711") and rate != G711_RATE:
            raise InvalidAudioError(f"G.711 audio is {G711_RATE} Hz, not {rate} Hz")
        if not MIN_RATE <= rate <= MAX_RATE:
            raise InvalidAudioError(f"sample rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
        samples = decode_samples(b64_decode(payload), audio_format)
        head = _EMPTY
        if self._key != (audio_format, rate):
            # A new format or rate mid-stream: finish the old stream, start a fresh filter.
            head = self.flush()
            self._key = (audio_format, rate)
            self._resampler = StreamResampler(rate, self.engine_rate)
        assert self._resampler is not None
        out = self._resampler.process(samples)
        return out if not head.size else np.concatenate([head, out])

    def flush(self) -> FloatArray:
        """The held-back tail (end of a turn); the stream continues afterwards."""
        return _EMPTY if self._resampler is None else self._resampler.flush()

    def reset(self) -> None:
        """Forget buffered input (``input_audio_buffer.clear``)."""
        self._key = None
        self._resampler = None
