"""Client events of the realtime WebSocket routes: one JSON text frame -> one typed action.

``parse_client_event(text, rules)`` validates a frame and returns either a session
command (``rtserve.sessions.commands``) or one of the transport actions below, which the
connection resolves itself (they need its audio decoder or its socket). Anything it
cannot accept raises ``WireError`` with the stable code, message and ``param`` the client
receives in an ``error`` event (all of type ``invalid_request_error``;
docs/serving.md#errors):

* not JSON, not an object, no or an unknown ``type``, a malformed field, ``session.update``
  without a ``session`` object -> ``invalid_event``, "Invalid or unrecognized client
  event: <detail>", ``param`` naming the field;
* an append with bad base64 -> ``invalid_base64``, "Invalid base64 audio data" (raised by
  the connection's decoder);
* an unsupported value (a response shape here; audio format, rate or turn detection in
  ``session_object``) -> ``invalid_value`` or ``unsupported_turn_detection``, naming it.

Event names accepted on every realtime connection are the OpenAI Realtime client events
(GA and beta spellings share them). Duplex connections also accept the duplex
extensions (docs/sessions.md#duplex-extensions): ``session.heartbeat``, ``session.event_ack``, ``session.close``,
``session.resume``, ``playback.ack``, ``overlap.decision``, ``turn.signal``/``barge_in``,
``input.cancel``, ``input.text.append``, ``response.speak`` (say this text: a response
whose audio is the engine's TTS of it), the native opener ``session.create`` and a few
legacy aliases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from rtserve import untrusted_json
from rtserve.errors import INVALID_VALUE
from rtserve.sessions import commands as cmd
from rtserve.sessions.session_config import AudioFormat
from rtserve.web.realtime.audio_items import CreateAudioItem, ItemPart
from rtserve.web.realtime.errors import MAX_ECHOED_CHARS, WireError, field_path, invalid_event
from rtserve.web.realtime.session_object import FormatField, MaxTokens, audio_format, session_changes
from rtserve.web.realtime.tools import function_item, with_response_tools

# ---------------------------------------------------------------------------
# Transport actions (resolved by the connection, not by the session core)
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpdateSession:
    """``session.update`` (or the native ``session.create``): SessionConfig field changes.
    On a connection without a session it opens one with this configuration."""

    changes: dict[str, Any]
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ResumeSession:
    """``session.resume``, or a connection opened with ``?session_id=...&resume=<token>``."""

    session_id: str
    resume_token: str
    generation: int | None  # None: the generation the token was issued with (vLLM-Omni sends none)
    last_received_seq: int | None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class AppendInput:
    audio: str  # base64, decoded by the connection's InputAudioDecoder
    audio_format: AudioFormat | None = None  # per-append override (duplex extension)
    sample_rate: int | None = None
    is_speech: bool | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommitInput:
    response_create: bool = False
    event_id: str | None = None
    final: bool | None = None  # vLLM's transcription flow (``vllm_transcription``); None: an OpenAI commit
    is_speech: bool | None = None  # duplex: False declares silence


@dataclass(frozen=True, slots=True)
class ClearInput:
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class CancelInput:
    """``input.cancel`` (vLLM-Omni duplex): drop the uncommitted input and advance the epoch
    (agent output in flight is cancelled, as ``output_audio_buffer.clear`` does)."""

    event_id: str | None = None


ClientAction = (
    UpdateSession | ResumeSession | AppendInput | CommitInput | ClearInput | CancelInput | CreateAudioItem | cmd.Command
)


@dataclass(frozen=True, slots=True)
class EventRules:
    """Which event set a connection accepts and what the session update may ask for."""

    duplex: bool
    supports_server_vad: bool


# ---------------------------------------------------------------------------
# Client events
# ---------------------------------------------------------------------------


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")
    event_id: StrictStr | None = None


class _Append(_Event):
    audio: StrictStr
    format: FormatField | None = None  # duplex extension: this chunk's own format
    input_audio_format: FormatField | None = None
    sample_rate_hz: Annotated[StrictInt, Field(ge=8000, le=192000)] | None = None
    is_speech: StrictBool | None = None


class _Commit(_Event):
    response_create: StrictBool = False
    final: StrictBool | None = None
    is_speech: StrictBool | None = None  # duplex: False declares silence (answered by response.listen)


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None
    transcript: StrictStr | None = None
    audio: StrictStr | None = None  # input_audio: base64 in the session's input format
    image_url: StrictStr | None = None  # input_image: a data URL (bounded by the connection, docs/video.md)


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | None = None
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[_ContentPart] = Field(min_length=1)


class _ItemCreate(_Event):
    previous_item_id: StrictStr | None = None
    item: _Item


class _ItemTruncate(_Event):
    item_id: StrictStr
    content_index: Annotated[StrictInt, Field(ge=0)] = 0
    audio_end_ms: Annotated[StrictInt, Field(ge=0)]


class _TextAppend(_Event):
    text: StrictStr


def _text_append(e: _TextAppend) -> cmd.ConversationItemCreate:
    """``input.text.append``: typed user input, a user message in the conversation."""
    return cmd.ConversationItemCreate(role="user", text=e.text, event_id=e.event_id)


class _Speak(_Event):
    text: StrictStr
    voice: StrictStr | None = None


def _speak(e: _Speak) -> cmd.ResponseCreate:
    """``response.speak``: a response that says ``text`` as is (engines with their own TTS)."""
    if not e.text.strip():
        raise WireError(INVALID_VALUE, "text must contain something to say", param="text", event_id=e.event_id)
    return cmd.ResponseCreate(speak=e.text, modalities=("audio", "text"), voice=e.voice, event_id=e.event_id)


class _ItemRef(_Event):
    item_id: StrictStr


class _ResponseAudioOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    voice: StrictStr | None = None
    format: FormatField | None = None


class _ResponseAudio(BaseModel):
    model_config = ConfigDict(extra="ignore")
    output: _ResponseAudioOutput | None = None


class _ResponseBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    instructions: StrictStr | None = None
    modalities: list[Literal["audio", "text"]] | None = Field(None, min_length=1)
    output_modalities: list[Literal["audio", "text"]] | None = Field(None, min_length=1)
    voice: StrictStr | None = None
    audio: _ResponseAudio | None = None
    output_audio_format: FormatField | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None
    metadata: dict[str, StrictStr] | None = None
    conversation: StrictStr | None = None
    input: list[Any] | None = None


class _ResponseCreate(_Event):
    response: _ResponseBody | None = None


class _ResponseCancel(_Event):
    response_id: StrictStr | None = None


class _SessionUpdate(_Event):
    session: Any = None  # validated by session_changes (a missing session is invalid_event)


class _Resume(_Event):
    session_id: StrictStr
    resume_token: StrictStr
    attachment_generation: StrictInt | None = None
    lease_generation: StrictInt | None = None
    last_received_server_event_seq: Annotated[StrictInt, Field(ge=0)] | None = None


class _EventAck(_Event):
    server_event_seq: Annotated[StrictInt, Field(ge=0)]


class _PlaybackAck(_Event):
    response_id: StrictStr
    played_ms: Annotated[StrictInt, Field(ge=0)]
    committed_ms: Annotated[StrictInt, Field(ge=0)] | None = None
    truncate: StrictBool = False


class _OverlapDecision(_Event):
    action: Literal["barge_in", "listen", "drop"]
    overlap_ms: Annotated[StrictInt, Field(ge=0)] | None = None


class _TurnSignalPayload(BaseModel):
    model_config = ConfigDict(extra="ignore")
    source: StrictStr = "client_event"


class _TurnSignal(_Event):
    event: Literal["barge_in"] = "barge_in"
    payload: _TurnSignalPayload = _TurnSignalPayload()


def _validated(model: type[_Event], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = field_path(err["loc"])
        raise invalid_event(f"'{where}': {err['msg']}", param=where or None, event_id=_event_id_of(data)) from None


def _commit(e: _Commit, rules: EventRules) -> CommitInput:
    return CommitInput(e.response_create and rules.duplex, e.event_id, e.final, e.is_speech if rules.duplex else None)


def _session_update(data: dict[str, Any], rules: EventRules) -> UpdateSession:
    e = _validated(_SessionUpdate, data)
    if "session" not in data and isinstance(data.get("model"), str):
        return UpdateSession({"model": data["model"][: MAX_ECHOED_CHARS * 4]}, e.event_id)  # vLLM's flat form
    if "session" not in data:
        raise invalid_event("'session' is required", param="session", event_id=e.event_id)
    try:
        return UpdateSession(session_changes(e.session, supports_server_vad=rules.supports_server_vad), e.event_id)
    except WireError as exc:
        exc.event_id = e.event_id
        raise


def _append(data: dict[str, Any], rules: EventRules) -> AppendInput:
    e = _validated(_Append, data)
    if not rules.duplex:  # vLLM clients name their rate on plain OpenAI connections too
        return AppendInput(e.audio, sample_rate=e.sample_rate_hz, event_id=e.event_id)
    fmt = e.format or e.input_audio_format
    chunk_format, rate = None, e.sample_rate_hz
    if fmt is not None:
        try:
            chunk_format, format_rate = audio_format(fmt, "format")
        except WireError as exc:
            exc.event_id = e.event_id
            raise
        rate = rate or format_rate
    return AppendInput(e.audio, chunk_format, rate, e.is_speech, e.event_id)


def _item_create(
    data: dict[str, Any], rules: EventRules
) -> cmd.ConversationItemCreate | cmd.FunctionItemCreate | CreateAudioItem:
    if (function := function_item(data)) is not None:
        return function
    e = _validated(_ItemCreate, data)
    if any(part.type == "input_audio" for part in e.item.content):
        return _audio_item(e)
    texts, images = [], []
    for part in e.item.content:
        if part.type == "input_image":
            if part.image_url is None:
                raise invalid_event("'item.content.image_url' is required", param="item.content", event_id=e.event_id)
            images.append(part.image_url)
            continue
        if part.type not in ("input_text", "text", "output_text"):
            raise WireError(
                INVALID_VALUE,
                f"Content of type {part.type[:MAX_ECHOED_CHARS]!r} is not supported; "
                "items carry text and images (input_text / output_text / input_image)",
                param="item.content",
                event_id=e.event_id,
            )
        texts.append(part.text or "")
    if images and e.item.role != "user":
        raise WireError(
            INVALID_VALUE, "input_image content is for user messages", param="item.role", event_id=e.event_id
        )
    return cmd.ConversationItemCreate(
        role=e.item.role,
        text="".join(texts),
        images=tuple(images),
        previous_item_id=e.previous_item_id,
        item_id=e.item.id,
        event_id=e.event_id,
    )


def _audio_item(e: _ItemCreate) -> CreateAudioItem:
    """A message with ``input_audio`` parts: transcribed by the connection (``audio_items``)."""
    parts = []
    for part in e.item.content:
        if part.type == "input_audio":
            if part.audio is None and part.transcript is None:
                raise invalid_event("'item.content.audio' is required", param="item.content", event_id=e.event_id)
            parts.append(ItemPart(text=part.transcript) if part.transcript is not None else ItemPart(audio=part.audio))
        elif part.type in ("input_text", "text"):
            parts.append(ItemPart(text=part.text or ""))
        else:
            raise WireError(
                INVALID_VALUE,
                f"Content of type {part.type[:MAX_ECHOED_CHARS]!r} cannot be mixed with input_audio; use input_text",
                param="item.content",
                event_id=e.event_id,
            )
    if e.item.role != "user":
        raise WireError(
            INVALID_VALUE, "input_audio content is for user messages", param="item.role", event_id=e.event_id
        )
    return CreateAudioItem(e.item.role, tuple(parts), e.previous_item_id, e.item.id, e.event_id)


def _response_create(data: dict[str, Any], rules: EventRules) -> cmd.ResponseCreate:
    e = _validated(_ResponseCreate, data)
    r = e.response or _ResponseBody()
    conversation, response_input = _out_of_band(r, e.event_id)
    audio_out = r.audio.output if r.audio is not None else None
    if r.output_audio_format is not None or (audio_out is not None and audio_out.format is not None):
        raise WireError(
            INVALID_VALUE,
            "Per-response audio formats are not supported; set the format with session.update",
            param="response.audio.output.format",
            event_id=e.event_id,
        )
    modalities = r.output_modalities or r.modalities
    tokens = r.max_output_tokens or r.max_response_output_tokens
    return cmd.ResponseCreate(
        instructions=r.instructions,
        modalities=tuple(dict.fromkeys(modalities)) if modalities else None,
        voice=(audio_out.voice if audio_out is not None else None) or r.voice,
        temperature=r.temperature,
        max_output_tokens=tokens if isinstance(tokens, int) else None,  # "inf": the session's own limit
        metadata=r.metadata,
        conversation=conversation,
        input=response_input,
        event_id=e.event_id,
    )


class _InputItem(BaseModel):
    """One item of ``response.input``: a message (text parts) or an ``item_reference``."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["message", "item_reference"] = "message"
    id: StrictStr | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[_ContentPart] = []


def _out_of_band(
    r: _ResponseBody, event_id: str | None
) -> tuple[Literal["auto", "none"], tuple[cmd.ResponseInput, ...] | None]:
    """``conversation`` ("auto" or "none") and ``input`` of an out-of-band ``response.create``."""
    if r.conversation not in (None, "auto", "none"):
        raise WireError(
            INVALID_VALUE, "conversation must be 'auto' or 'none'", param="response.conversation", event_id=event_id
        )
    conversation: Literal["auto", "none"] = "none" if r.conversation == "none" else "auto"
    if r.input is None:
        return conversation, None
    items = []
    for index, raw in enumerate(r.input):
        param = f"response.input.{index}"
        try:
            item = _InputItem.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = field_path(err["loc"])
            raise invalid_event(
                f"'{param}.{where}': {err['msg']}", param=f"{param}.{where}", event_id=event_id
            ) from None
        if item.type == "item_reference":
            if item.id is None:
                raise invalid_event(f"'{param}.id' is required", param=f"{param}.id", event_id=event_id)
            items.append(cmd.ResponseInput(item_id=item.id))
            continue
        if item.role is None:
            raise invalid_event(f"'{param}.role' is required", param=f"{param}.role", event_id=event_id)
        texts = []
        for part in item.content:
            if part.type not in ("input_text", "text", "output_text"):
                raise WireError(
                    INVALID_VALUE,
                    f"Content of type {part.type[:MAX_ECHOED_CHARS]!r} is not supported "
                    "in response.input; use input_text / output_text",
                    param=f"{param}.content",
                    event_id=event_id,
                )
            texts.append(part.text or "")
        items.append(cmd.ResponseInput(role=item.role, text="".join(texts)))
    return conversation, tuple(items)


def _resume(data: dict[str, Any], rules: EventRules) -> ResumeSession:
    e = _validated(_Resume, data)
    generation = e.attachment_generation if e.attachment_generation is not None else e.lease_generation
    return ResumeSession(e.session_id, e.resume_token, generation, e.last_received_server_event_seq, e.event_id)


_Parser = Callable[[dict[str, Any], EventRules], ClientAction]

_REALTIME: dict[str, _Parser] = {
    "session.update": _session_update,
    "input_audio_buffer.append": _append,
    "input_audio_buffer.commit": lambda d, r: _commit(_validated(_Commit, d), r),
    "input_audio_buffer.clear": lambda d, r: ClearInput(_validated(_Event, d).event_id),
    "output_audio_buffer.clear": lambda d, r: cmd.Clear(target="output", event_id=_validated(_Event, d).event_id),
    "conversation.item.create": _item_create,
    "conversation.item.truncate": lambda d, r: _truncate(_validated(_ItemTruncate, d)),
    "conversation.item.delete": lambda d, r: cmd.ConversationItemDelete(
        item_id=_validated(_ItemRef, d).item_id, event_id=_event_id_of(d)
    ),
    "conversation.item.retrieve": lambda d, r: cmd.ConversationItemRetrieve(
        item_id=_validated(_ItemRef, d).item_id, event_id=_event_id_of(d)
    ),
    "response.create": lambda d, r: with_response_tools(_response_create(d, r), d),
    "response.cancel": lambda d, r: cmd.ResponseCancel(
        response_id=_validated(_ResponseCancel, d).response_id, event_id=_event_id_of(d)
    ),
}

_DUPLEX: dict[str, _Parser] = {
    "session.create": _session_update,
    "session.heartbeat": lambda d, r: cmd.Heartbeat(event_id=_validated(_Event, d).event_id),
    "session.event_ack": lambda d, r: cmd.EventAck(
        server_event_seq=_validated(_EventAck, d).server_event_seq, event_id=_event_id_of(d)
    ),
    "session.close": lambda d, r: cmd.Close(event_id=_validated(_Event, d).event_id),
    "session.resume": _resume,
    "playback.ack": lambda d, r: _playback_ack(_validated(_PlaybackAck, d)),
    "overlap.decision": lambda d, r: _overlap(_validated(_OverlapDecision, d)),
    "turn.signal": lambda d, r: _barge_in(_validated(_TurnSignal, d)),
    "barge_in": lambda d, r: cmd.BargeIn(event_id=_validated(_Event, d).event_id),
    # vLLM-Omni duplex input events (docs/sessions.md#duplex-extensions)
    "input.cancel": lambda d, r: CancelInput(_validated(_Event, d).event_id),
    "input.text.append": lambda d, r: _text_append(_validated(_TextAppend, d)),
    "response.speak": lambda d, r: _speak(_validated(_Speak, d)),
}

_DUPLEX_ALIASES = {
    "input.commit": "input_audio_buffer.commit",
    "input.audio.append": "input_audio_buffer.append",
    "audio.playback_ack": "playback.ack",
    "signal_turn": "turn.signal",
    "close_session": "session.close",
    "session_close": "session.close",
    "close": "session.close",
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
}


def _truncate(e: _ItemTruncate) -> cmd.ConversationItemTruncate:
    return cmd.ConversationItemTruncate(
        item_id=e.item_id, audio_end_ms=e.audio_end_ms, content_index=e.content_index, event_id=e.event_id
    )


def _playback_ack(e: _PlaybackAck) -> cmd.PlaybackAck:
    return cmd.PlaybackAck(
        response_id=e.response_id,
        played_ms=e.played_ms,
        committed_ms=e.committed_ms,
        truncate=e.truncate,
        event_id=e.event_id,
    )


def _overlap(e: _OverlapDecision) -> cmd.OverlapDecision:
    return cmd.OverlapDecision(action=e.action, overlap_ms=e.overlap_ms, event_id=e.event_id)


def _barge_in(e: _TurnSignal) -> cmd.BargeIn:
    return cmd.BargeIn(source=e.payload.source[:MAX_ECHOED_CHARS], event_id=e.event_id)


def _event_id_of(data: dict[str, Any]) -> str | None:
    value = data.get("event_id")
    return value if isinstance(value, str) else None


def parse_client_event(text: str, rules: EventRules) -> ClientAction:
    """One text frame -> the action it asks for; raises ``WireError``."""
    try:
        data = untrusted_json.loads(text)
    except ValueError:
        raise invalid_event("not valid JSON") from None
    if not isinstance(data, dict):
        raise invalid_event("an event is a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise invalid_event("'type' is required", param="type", event_id=_event_id_of(data))
    if rules.duplex:
        kind = _DUPLEX_ALIASES.get(kind, kind)
    parser = _REALTIME.get(kind) or (_DUPLEX.get(kind) if rules.duplex else None)
    if parser is None:
        raise invalid_event(f"unknown type {kind[:MAX_ECHOED_CHARS]!r}", param="type", event_id=_event_id_of(data))
    return parser(data, rules)
