"""The messages of ``WS /v1/video/chat/stream`` (docs/video.md#video-chat-stream): JSON text
frames both ways, camera frames also as binary messages (one JPEG or PNG each)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from rtserve.codecs.images import ImageError
from rtserve.codecs.pcm import float_to_pcm16
from rtserve.errors import INVALID_JSON, INVALID_VALUE, RtserveError
from rtserve.sessions import events as ev


class VideoChatWireError(RtserveError):
    """A client message this protocol does not take."""

    code = INVALID_VALUE


@dataclass(frozen=True)
class FrameIn:
    image: bytes  # JPEG or PNG, checked by ``codecs.images``


@dataclass(frozen=True)
class QuestionIn:
    text: str
    max_output_tokens: int | None = None  # the answer's bound (None: the session's)


@dataclass(frozen=True)
class CloseIn:
    pass


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["frame", "text", "close"]
    image: StrictStr | None = None
    text: StrictStr | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None


def parse_text(raw: str, max_text_chars: int) -> FrameIn | QuestionIn | CloseIn:
    """A JSON text message; raises ``VideoChatWireError`` (or ``ImageError`` for a frame's base64)."""
    try:
        message = _Message.model_validate_json(raw)
    except ValidationError as exc:
        invalid_json = any(error["type"] == "json_invalid" for error in exc.errors())
        where = ".".join(str(part) for part in exc.errors()[0]["loc"]) or "type"
        raise VideoChatWireError(
            "Messages are JSON objects: frame (image), text (text, max_output_tokens) or close",
            code=INVALID_JSON if invalid_json else INVALID_VALUE,
            param=None if invalid_json else where,
        ) from None
    if message.type == "close":
        return CloseIn()
    if message.type == "frame":
        if message.image is None:
            raise VideoChatWireError("A frame message needs 'image' (base64 JPEG or PNG)", param="image")
        try:
            return FrameIn(base64.b64decode(message.image, validate=True))
        except (binascii.Error, ValueError):
            raise ImageError("'image' is not valid base64", param="image") from None
    text = (message.text or "").strip()
    if not text or len(text) > max_text_chars:
        raise VideoChatWireError(f"'text' must hold 1 to {max_text_chars} characters", param="text")
    return QuestionIn(text, message.max_output_tokens)


def session_created(session_id: str) -> str:
    return json.dumps({"type": "session.created", "session_id": session_id})


def error(exc: RtserveError) -> str:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.param is not None:
        body["param"] = exc.param
    return json.dumps({"type": "error", "error": body})


def event_message(event: ev.SessionEvent) -> str | None:
    """A session event as this protocol's message; None for the events it leaves out."""
    if isinstance(event, ev.TextDelta | ev.TranscriptDelta):
        if not event.delta:
            return None
        return json.dumps({"type": "response.text.delta", "response_id": event.response_id, "delta": event.delta})
    if isinstance(event, ev.AudioDelta):
        pcm16 = float_to_pcm16(event.pcm)
        return json.dumps(
            {
                "type": "response.audio.delta",
                "response_id": event.response_id,
                "audio": base64.b64encode(pcm16).decode("ascii"),
                "sample_rate_hz": event.sample_rate,
            }
        )
    if isinstance(event, ev.ResponseDone):
        text = "".join(item.text or "" for item in event.output)
        return json.dumps(
            {"type": "response.done", "response_id": event.response_id, "status": event.status, "text": text}
        )
    if isinstance(event, ev.ErrorEvent):
        body: dict[str, Any] = {"code": event.code, "message": event.message}
        if event.param is not None:
            body["param"] = event.param
        return json.dumps({"type": "error", "error": body})
    return None
