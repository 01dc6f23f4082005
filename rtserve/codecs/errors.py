"""Typed codec errors.

Every decoder in ``rtserve.codecs`` rejects malformed input by raising a ``CodecError``
subclass and nothing else. ``code`` is a stable machine-readable string that transports
copy into their error events (an ``RtserveError``); ``str(error)`` is a short human message with no internal
paths. ``CodecError`` is a ``ValueError`` so generic "bad value" handling also catches it.
"""

from __future__ import annotations

from rtserve.errors import (
    AUDIO_LIMIT_EXCEEDED,
    INVALID_AUDIO,
    INVALID_BASE64,
    INVALID_OGG,
    INVALID_OPUS,
    INVALID_WAV,
    UNSUPPORTED_FORMAT,
    RtserveError,
)


class CodecError(RtserveError, ValueError):
    """Malformed or unsupported audio input."""

    code = INVALID_AUDIO


class InvalidAudioError(CodecError):
    """Raw sample data is unusable: wrong byte count, NaN/Inf, wrong shape."""

    code = INVALID_AUDIO


class InvalidBase64Error(CodecError):
    """A base64 audio payload is not valid base64."""

    code = INVALID_BASE64


class InvalidOggError(CodecError):
    """Bytes that are not a well-formed Ogg-Opus stream (RFC 3533, RFC 7845)."""

    code = INVALID_OGG


class InvalidOpusError(CodecError):
    """An Opus packet that libopus cannot decode."""

    code = INVALID_OPUS


class InvalidWavError(CodecError):
    """Bytes that are not a well-formed RIFF/WAVE file."""

    code = INVALID_WAV


class AudioLimitError(CodecError):
    """Valid input that would decode to more audio than a configured limit allows."""

    code = AUDIO_LIMIT_EXCEEDED


class UnsupportedFormatError(CodecError):
    """Well-formed input in a variant this server does not decode (e.g. 24-bit WAV)."""

    code = UNSUPPORTED_FORMAT
