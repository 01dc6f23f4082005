"""The ``/api/asr-streaming`` messages, as moshi-server and Kyutai's clients spell them
(docs/serving.md#asr-streaming): one msgpack map per binary WebSocket message, its ``type``
naming the kind.

Client: ``{"type": "Audio", "pcm": [float, ...]}`` (mono 24 kHz, any length) and
``{"type": "Marker", "id": int}``; ``Init`` (moshi-server's batched mode) is accepted and ignored.
Server: ``Ready``, ``Step`` (``step_idx``, ``prs``, ``buffered_pcm``), ``Word`` (``text``,
``start_time``), ``EndWord`` (``stop_time``), ``Marker`` (``id``), ``Error`` (``message``, and
rtserve's ``code``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.kyutai_stt.events import EndWord, Marker, Step, SttEvent, Word
from rtserve.errors import INVALID_AUDIO, INVALID_MESSAGE, INVALID_MSGPACK, UNKNOWN_MESSAGE_TYPE, RtserveError

_MAX_MARKER_ID = 2**63 - 1


class AsrWireError(RtserveError):
    """A client message that cannot be taken; ``code`` says which rule it broke."""


@dataclass(frozen=True)
class AudioIn:
    pcm: FloatArray


@dataclass(frozen=True)
class MarkerIn:
    id: int


@dataclass(frozen=True)
class InitIn:
    pass


ClientMessage = AudioIn | MarkerIn | InitIn


def parse(data: bytes) -> ClientMessage:
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise AsrWireError(f"not a msgpack message: {type(exc).__name__}", code=INVALID_MSGPACK) from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise AsrWireError("a message is a msgpack map with a string 'type'", code=INVALID_MESSAGE)
    kind = message["type"]
    if kind == "Audio":
        return AudioIn(_pcm(message.get("pcm")))
    if kind == "Marker":
        marker = message.get("id")
        if isinstance(marker, bool) or not isinstance(marker, int) or abs(marker) > _MAX_MARKER_ID:
            raise AsrWireError("Marker 'id' must be a 64-bit integer", code=INVALID_MESSAGE)
        return MarkerIn(marker)
    if kind == "Init":
        return InitIn()
    raise AsrWireError(f"unknown message type {kind[:40]!r} (Audio, Marker)", code=UNKNOWN_MESSAGE_TYPE)


def _pcm(value: Any) -> FloatArray:
    # One pass in C, not a type check per sample (that was a third of the event loop at 32
    # streams): numbers make a flat float or int array; strings, None, maps, nesting do not.
    try:
        array = np.array(value) if isinstance(value, list) else None
    except ValueError:  # ragged nesting
        array = None
    if array is None or array.ndim != 1 or array.dtype.kind not in "fiu":
        raise AsrWireError("Audio 'pcm' must be an array of floats", code=INVALID_MESSAGE)
    with np.errstate(over="ignore"):  # past float32's range is inf, refused below
        samples = array.astype(np.float32)
    if not np.isfinite(samples).all():
        raise AsrWireError("Audio 'pcm' samples must be finite", code=INVALID_AUDIO)
    return samples


def _pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message, use_single_float=False)
    return packed


READY = _pack({"type": "Ready"})


def pack_event(event: SttEvent) -> bytes:
    match event:
        case Word(text, start_time):
            return _pack({"type": "Word", "text": text, "start_time": start_time})
        case EndWord(stop_time):
            return _pack({"type": "EndWord", "stop_time": stop_time})
        case Step(step_idx, prs, buffered_pcm):
            return _pack({"type": "Step", "step_idx": step_idx, "prs": list(prs), "buffered_pcm": buffered_pcm})
        case Marker(marker_id):
            return _pack({"type": "Marker", "id": marker_id})


def pack_error(error: RtserveError) -> bytes:
    return _pack({"type": "Error", "message": error.message, "code": error.code})
