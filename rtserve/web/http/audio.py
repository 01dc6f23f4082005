"""Audio files for the HTTP routes: streaming speech encoders and upload decoding.

Speech leaves the server at 24 kHz mono, OpenAI's speech rate (its ``pcm`` format is
defined as raw 16-bit little-endian samples at 24 kHz). Encoders are incremental: each
``encode`` call returns the bytes the format can emit so far, so a response streams while
the TTS engine is still speaking. Compressed formats go through PyAV's encoders and
muxers; ``wav``/``pcm`` are a header and raw samples.

Uploads are decoded with PyAV (any container/codec FFmpeg knows), downmixed to mono
float32, then resampled (``rtserve.codecs.resample.StreamResampler``) to the rate the ASR engine wants.
"""

from __future__ import annotations

import struct
from typing import IO, Literal, Protocol

import av
import numpy as np

from rtserve.codecs.errors import AudioLimitError, InvalidAudioError
from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray, float_to_pcm16
from rtserve.codecs.resample import StreamResampler

SPEECH_SAMPLE_RATE = WIRE_SAMPLE_RATE

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]

CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",  # Ogg-encapsulated Opus, as OpenAI returns it
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

# The PyAV encoders of the compressed formats: audio codecs, so their streams are audio streams.
EncoderCodec = Literal["libmp3lame", "libopus", "aac", "flac"]

# format -> (PyAV container format, encoder, muxer options)
_PYAV_FORMATS: dict[str, tuple[str, EncoderCodec, dict[str, str]]] = {
    "mp3": ("mp3", "libmp3lame", {}),
    # Ogg holds packets for up to a second per page by default; 20 ms pages keep it streaming.
    "opus": ("ogg", "libopus", {"page_duration": "20000"}),
    "aac": ("adts", "aac", {}),
    "flac": ("flac", "flac", {}),
}

# OpenAI streams WAV with unknown length: both RIFF and data sizes set to the maximum.
_UNKNOWN_SIZE = 0xFFFFFFFF


class SpeechEncoder(Protocol):
    def encode(self, pcm: FloatArray) -> bytes:
        """Mono float32 at ``SPEECH_SAMPLE_RATE`` in; whatever bytes are ready out."""
        ...

    def finish(self) -> bytes:
        """Flush the encoder and close the container; the tail of the file."""
        ...


def wav_stream_header(sample_rate: int) -> bytes:
    """A 16-bit mono WAV header for a stream whose length is not known yet."""
    byte_rate = sample_rate * 2
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, byte_rate, 2, 16)
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


class Pcm16Encoder:
    """Raw s16le samples, optionally preceded by a streaming WAV header."""

    def __init__(self, header: bytes = b"") -> None:
        self._pending_header = header

    def encode(self, pcm: FloatArray) -> bytes:
        out = self._pending_header + float_to_pcm16(pcm)
        self._pending_header = b""
        return out

    def finish(self) -> bytes:
        out, self._pending_header = self._pending_header, b""
        return out


class _ByteSink:
    """A write-only, non-seekable file for PyAV: muxed bytes accumulate until taken."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class PyAVEncoder:
    """A PyAV encoder + muxer writing into memory, drained after every call."""

    def __init__(self, container_format: str, codec: EncoderCodec, options: dict[str, str], sample_rate: int) -> None:
        self._sink = _ByteSink()
        self._container = av.open(self._sink, mode="w", format=container_format, options=options)
        self._stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
        self._sample_rate = sample_rate
        # Encoders want their own sample format (s16, s32p, fltp, ...): convert, same rate.
        self._convert = av.AudioResampler(
            format=self._stream.codec_context.format.name, layout="mono", rate=sample_rate
        )
        self._pts = 0

    def encode(self, pcm: FloatArray) -> bytes:
        if pcm.size == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = self._sample_rate
        frame.pts = self._pts
        self._pts += pcm.size
        for converted in self._convert.resample(frame):
            self._mux(converted)
        return self._sink.take()

    def finish(self) -> bytes:
        for converted in self._convert.resample(None):
            self._mux(converted)
        self._mux(None)
        self._container.close()
        return self._sink.take()

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)


def open_speech_encoder(response_format: SpeechFormat, sample_rate: int = SPEECH_SAMPLE_RATE) -> SpeechEncoder:
    if response_format == "pcm":
        return Pcm16Encoder()
    if response_format == "wav":
        return Pcm16Encoder(wav_stream_header(sample_rate))
    container_format, codec, options = _PYAV_FORMATS[response_format]
    return PyAVEncoder(container_format, codec, options, sample_rate)


# ---------------------------------------------------------------------------
# Uploads
# ---------------------------------------------------------------------------


def decode_audio(source: IO[bytes], sample_rate: int, max_seconds: float) -> FloatArray:
    """Decode the first audio stream of ``source`` to mono float32 at ``sample_rate``.

    Blocking (runs on the codec executor). Stops as soon as the decoded audio passes
    ``max_seconds`` (``AudioLimitError``), so a small file that expands to hours cannot
    exhaust memory. Anything else wrong with the upload is another ``CodecError``.
    """
    max_samples = int(max_seconds * sample_rate)
    pieces: list[FloatArray] = []
    total = 0
    try:
        # Tags are never read, and a tag that is not UTF-8 must not make valid audio a 500.
        with av.open(source, mode="r", metadata_errors="replace") as container:
            stream = next(iter(container.streams.audio), None)
            if stream is None:
                raise InvalidAudioError("the file has no audio stream")
            downmix = av.AudioResampler(format="flt", layout="mono")  # keeps the source rate
            resampler: StreamResampler | None = None
            for frame in container.decode(stream):
                for mono in downmix.resample(frame):
                    if resampler is None:
                        resampler = StreamResampler(mono.sample_rate, sample_rate)
                    # ``flt`` frames: float32 already, so this neither copies nor converts.
                    samples = np.asarray(mono.to_ndarray(), dtype=np.float32).reshape(-1)
                    out = resampler.process(samples)
                    total += out.size
                    if total > max_samples:
                        raise AudioLimitError(f"audio is longer than the {max_seconds:g} s limit")
                    pieces.append(out)
            if resampler is not None:
                pieces.append(resampler.flush())
    except av.FFmpegError as exc:
        raise InvalidAudioError("the file could not be decoded as audio") from exc
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return audio[:max_samples]
