"""Streaming Opus encoder and decoder on PyAV's libopus (one instance per connection).

Frame durations: we offer 20, 40, 60 and 80 ms. PyAV's libopus (libopus >= 1.2) accepts
80 ms directly as ``frame_duration`` and returns ONE packet per 80 ms: a code-3 packet
carrying 4 x 20 ms Opus frames, the packet shape Moshi's own server (sphn) emits for its
1920-sample frames. (100 and 120 ms also work in libopus; nothing here needs them.)

Sample rates: the encoder runs natively at any libopus rate. FFmpeg's libopus decoder
always outputs 48 kHz, so the decoder resamples to other rates with a ``StreamResampler``
(libswresample: every packet's samples come out with it, less a fixed 16-sample delay at 24
kHz, so 80 ms packets give whole 1920-sample engine frames). ``flush()`` returns the held-back tail.

Application: default "audio" (CELT, waveform-matching: 17-27 dB SNR at 32-64 kbit/s on
speech-like signals), right for the synthesized speech this server sends; "voip" (SILK,
tuned for microphone speech, perceptually good but only ~6 dB waveform SNR) and
"lowdelay" (CELT only, 2.5 ms lookahead instead of 6.5 ms) are available.

Complexity: libopus's default 10 costs ~14 ms CPU per second of 24 kHz audio; 5 costs
~5 ms (see benchmarks/bench_codecs.py), the knob for many concurrent streams.

Digital silence: after ~20 frames of exact zeros libopus's float encoder state decays into
denormal numbers and every frame then costs 4-10x a frame of speech (PyAV's libopus 1.6:
~1 ms instead of ~0.1-0.25 ms per 80 ms at complexity 5). An all-zero frame is therefore
encoded as a constant of ``SILENCE_FLOOR`` (-180 dBFS, the classic anti-denormal offset):
libopus codes it as the same silence frame (identical packets), without the denormals.

Codec delay: libopus output lags its input by ``pre_skip_48k`` samples at 48 kHz (6.5 ms
for the default application). Ogg-Opus carries it as pre-skip; raw-packet users drop it or
accept it.
"""

from __future__ import annotations

import struct
from typing import Literal

import av
import numpy as np

from rtserve.codecs.errors import InvalidOpusError
from rtserve.codecs.pcm import FloatArray, as_mono_float32
from rtserve.codecs.resample import StreamResampler

OpusApplication = Literal["voip", "audio", "lowdelay"]

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
OPUS_FRAME_MS = (20, 40, 60, 80)
OPUS_GRANULE_RATE = 48000  # Opus timestamps (Ogg granules, pre-skip) always count 48 kHz samples
_MIN_BITRATE, _MAX_BITRATE = 6000, 510000

_EMPTY = np.zeros(0, dtype=np.float32)
SILENCE_FLOOR = np.float32(1e-9)  # what an all-zero frame is encoded as (module doc: digital silence)


def check_opus_rate(sample_rate: int) -> None:
    if sample_rate not in OPUS_RATES:
        raise ValueError(f"Opus sample rate must be one of {OPUS_RATES}, got {sample_rate}")


class OpusEncoder:
    """Mono float32 PCM in any chunk size -> Opus packets of ``frame_ms`` each."""

    def __init__(
        self,
        sample_rate: int = 24000,
        frame_ms: int = 20,
        bitrate: int = 32000,
        application: OpusApplication = "audio",
        complexity: int = 10,
    ) -> None:
        check_opus_rate(sample_rate)
        if frame_ms not in OPUS_FRAME_MS:
            raise ValueError(f"Opus frame duration must be one of {OPUS_FRAME_MS} ms, got {frame_ms}")
        if not _MIN_BITRATE <= bitrate <= _MAX_BITRATE:
            raise ValueError(f"Opus bitrate must be in [{_MIN_BITRATE}, {_MAX_BITRATE}], got {bitrate}")
        if not 0 <= complexity <= 10:
            raise ValueError(f"Opus complexity must be in [0, 10], got {complexity}")
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * frame_ms // 1000
        self._ctx = av.CodecContext.create("libopus", "w")
        self._ctx.sample_rate = sample_rate
        self._ctx.layout = "mono"
        self._ctx.format = "flt"
        self._ctx.bit_rate = bitrate
        self._ctx.options = {
            "frame_duration": str(frame_ms),
            "application": application,
            "compression_level": str(complexity),  # FFmpeg's name for OPUS_SET_COMPLEXITY
        }
        self._ctx.open()
        # FFmpeg publishes the encoder's OpusHead (RFC 7845 §5.1) as extradata; bytes
        # 10-11 are the pre-skip, i.e. libopus's lookahead in 48 kHz samples.
        extradata = self._ctx.extradata or b""
        if not extradata.startswith(b"OpusHead") or len(extradata) < 12:
            raise RuntimeError("libopus encoder did not report its OpusHead")
        self.pre_skip_48k: int = struct.unpack_from("<H", extradata, 10)[0]
        self._lookahead = -(-self.pre_skip_48k * sample_rate // OPUS_GRANULE_RATE)
        self._pending = _EMPTY
        self._frames_encoded = 0
        self._silence = np.full(self.frame_samples, SILENCE_FLOOR, dtype=np.float32)

    @property
    def frame_duration_48k(self) -> int:
        """Duration of one packet in 48 kHz samples (the unit of Ogg granule positions)."""
        return self.frame_samples * OPUS_GRANULE_RATE // self.sample_rate

    def encode(self, samples: FloatArray) -> list[bytes]:
        """Buffer ``samples``; return one packet per complete frame now available."""
        samples = as_mono_float32(samples)
        pending = np.concatenate((self._pending, samples)) if self._pending.size else samples
        whole = len(pending) - len(pending) % self.frame_samples
        packets = [
            packet
            for start in range(0, whole, self.frame_samples)
            for packet in self._encode_frame(pending[start : start + self.frame_samples])
        ]
        self._pending = pending[whole:].copy()
        return packets

    def finish(self) -> list[bytes]:
        """Pad with silence until every sample given so far is decodable (lookahead
        included) and return the last packets. The encoder stays usable afterwards."""
        needed = len(self._pending) + self._lookahead
        if needed == 0:
            return []
        frames = -(-needed // self.frame_samples)
        padding = np.zeros(frames * self.frame_samples - len(self._pending), dtype=np.float32)
        return self.encode(padding)

    def _encode_frame(self, frame_samples: FloatArray) -> list[bytes]:
        if not frame_samples.any():
            frame_samples = self._silence
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(frame_samples)[None, :], format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._frames_encoded * self.frame_samples
        self._frames_encoded += 1
        return [bytes(packet) for packet in self._ctx.encode(frame)]


class OpusDecoder:
    """Opus packets -> mono float32 PCM at ``sample_rate`` (stereo streams are downmixed)."""

    def __init__(
        self,
        sample_rate: int = 24000,
        channels: int = 1,
    ) -> None:
        check_opus_rate(sample_rate)
        if channels not in (1, 2):
            raise ValueError(f"Opus decoder supports 1 or 2 channels, got {channels}")
        self.sample_rate = sample_rate
        self.channels = channels
        self._ctx = av.CodecContext.create("libopus", "r")
        self._ctx.layout = "mono" if channels == 1 else "stereo"
        self._ctx.options = {"request_sample_fmt": "flt"}
        self._ctx.open()
        self._resampler = StreamResampler(OPUS_GRANULE_RATE, sample_rate)

    def decode(self, packet: bytes) -> FloatArray:
        """Decode one packet; the output may lag while the resampler fills (see module doc)."""
        if not packet:
            # An empty AVPacket means end-of-stream to FFmpeg and would wedge the decoder.
            raise InvalidOpusError("empty Opus packet")
        try:
            frames = self._ctx.decode(av.Packet(packet))
        except av.FFmpegError as exc:
            raise InvalidOpusError("malformed Opus packet") from exc
        if not frames:
            return _EMPTY
        interleaved = np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames])
        pcm = interleaved if self.channels == 1 else interleaved.reshape(-1, self.channels).mean(axis=1)
        return self._resampler.process(pcm.astype(np.float32, copy=False))

    def flush(self) -> FloatArray:
        """End of stream: return the samples the resampler still holds."""
        return self._resampler.flush()
