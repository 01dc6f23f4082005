"""moshi-server's text-to-speech wire (docs/serving.md#tts-streaming): MessagePack maps tagged by
``type``, each in one binary WebSocket message.

Client: ``{"type": "Text", "text": ...}`` any number of times, then ``{"type": "Eos"}`` (a raw
``b"\\0"`` is end of stream too, and a text WebSocket message is text to speak, as moshi-server
takes them). Server, with ``format=PcmMessagePack``: ``Ready``, ``Audio`` (``pcm``: float32 at
24 kHz), ``Text`` (a word with ``start_s`` and ``stop_s``), ``Error`` (``message``, and the stable
``code`` moshi-server does not send); with ``format=OggOpus`` the audio as Ogg-Opus pages and
nothing else (an error is the close frame's reason).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgpack
from aiohttp import WSCloseCode

from rtserve.codecs.pcm import FloatArray
from rtserve.errors import ENGINE_ERROR, INVALID_MESSAGE, INVALID_MSGPACK, UNKNOWN_MESSAGE_TYPE, RtserveError
from rtserve.web.error_mapping import close_code

EOS_BYTES = b"\0"


class OutputFormat(enum.Enum):
    PCM_MESSAGE_PACK = "PcmMessagePack"
    OGG_OPUS = "OggOpus"


class WireError(RtserveError):
    code = INVALID_MESSAGE


@dataclass(frozen=True)
class TextIn:
    text: str


@dataclass(frozen=True)
class EosIn:
    pass


ClientMessage = TextIn | EosIn


def parse_binary(data: bytes) -> ClientMessage:
    if data == EOS_BYTES:
        return EosIn()
    try:
        message: Any = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException):
        raise WireError("a binary message must be one MessagePack map", code=INVALID_MSGPACK) from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise WireError("a message must be a MessagePack map with a string 'type'")
    kind = message["type"]
    if kind == "Text":
        text = message.get("text")
        if not isinstance(text, str):
            raise WireError("a Text message needs a string 'text'")
        return TextIn(text)
    if kind == "Eos":
        return EosIn()
    raise WireError(f"unknown message type {kind[:40]!r} (Text, Eos)", code=UNKNOWN_MESSAGE_TYPE)


def ready() -> bytes:
    return _pack({"type": "Ready"})


def audio(pcm: FloatArray) -> bytes:
    return _pack({"type": "Audio", "pcm": pcm.tolist()}, single_float=True)


def word(text: str, start_s: float, stop_s: float) -> bytes:
    return _pack({"type": "Text", "text": text, "start_s": start_s, "stop_s": stop_s})


def error(exc: RtserveError) -> bytes:
    return _pack({"type": "Error", "message": exc.message, "code": exc.code})


def close_code_for(exc: RtserveError) -> WSCloseCode:
    """The close after an ``Error``: the shared mapping (1013 retry later, ...), else 1008 for
    what the client did and 1011 for an engine failure."""
    code = close_code(exc)
    if code is WSCloseCode.INTERNAL_ERROR and exc.code != ENGINE_ERROR:
        return WSCloseCode.POLICY_VIOLATION
    return code


def _pack(message: dict[str, Any], *, single_float: bool = False) -> bytes:
    packed = msgpack.packb(message, use_bin_type=True, use_single_float=single_float)
    assert isinstance(packed, bytes)
    return packed
