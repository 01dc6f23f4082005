"""The native ``/v1/duplex`` dialect (docs/sessions.md#dialects-and-fallback): each typed event serialised flat.

Every event is ``{"type", "event_id", "session_id", "epoch", ...its own fields}`` with
the native names below. Audio deltas carry base64 ``audio`` in the session's ``format``
plus ``sample_rate_hz``; errors keep the Realtime ``error`` object so clients can share
one error handler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rtserve.sessions import events as ev
from rtserve.sessions.projections.audio import encode_audio_b64
from rtserve.sessions.projections.base import SESSION_EVENT_NAMES, compact_json, compact_json_with_blob

NATIVE_NAMES: dict[type[ev.SessionEvent], str] = {
    **SESSION_EVENT_NAMES,
    ev.SpeechStarted: "input.speech_started",
    ev.SpeechStopped: "input.speech_stopped",
    ev.InputCommitted: "input.committed",
    ev.InputCleared: "input.cleared",
    ev.InputTimeoutTriggered: "input.timeout_triggered",
    ev.InputTranscriptDelta: "input.transcript.delta",
    ev.InputTranscriptCompleted: "input.transcript.done",
    ev.ItemAdded: "conversation.item.added",
    ev.ItemDone: "conversation.item.done",
    ev.ItemDeleted: "conversation.item.deleted",
    ev.ItemTruncated: "conversation.item.truncated",
    ev.ItemRetrieved: "conversation.item.retrieved",
    ev.ResponseCreated: "response.created",
    ev.OutputItemAdded: "response.item.added",
    ev.OutputItemDone: "response.item.done",
    ev.ContentPartAdded: "response.part.added",
    ev.ContentPartDone: "response.part.done",
    ev.AudioDelta: "response.output_audio.delta",
    ev.TranscriptDelta: "response.transcript.delta",
    ev.TextDelta: "response.text.delta",
    ev.AudioDone: "response.output_audio.done",
    ev.TranscriptDone: "response.transcript.done",
    ev.TextDone: "response.text.done",
    ev.ResponseDone: "response.done",
    ev.RateLimitsUpdated: "rate_limits.updated",
    ev.OverlapDecided: "overlap.decision",
    ev.ResponseListen: "response.listen",
    ev.ResponseSpeak: "response.speak",
    ev.RuntimeControl: "runtime.control",
    ev.OutputAudioCleared: "audio.cancelled",
    ev.PlaybackAcknowledged: "playback.acknowledged",
    ev.FunctionCallArgumentsDelta: "response.function_call_arguments.delta",
    ev.FunctionCallArgumentsDone: "response.function_call_arguments.done",
}

# Identity fields every native event starts with; the rest follow in declaration order.
_HEAD = ("session_id", "epoch", "event_id", "server_event_seq")
_field_names: dict[type, tuple[str, ...]] = {}


def _names_of(cls: type) -> tuple[str, ...]:
    names = _field_names.get(cls)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in _HEAD)
        _field_names[cls] = names
    return names


def _plain(value: Any) -> Any:
    """Snapshots, configs and containers as JSON-ready values."""
    if isinstance(value, ev.SessionSnapshot):
        return {
            "id": value.id,
            **value.config.model_dump(mode="json"),
            "epoch": value.epoch,
            "turn_id": value.turn_id,
            "capabilities": {**value.capabilities, "supports_session_resume": value.resumable},
        }
    if isinstance(value, ev.ItemSnapshot):  # function fields only on function items
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None or f.name not in ("call_id", "name")
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


class NativeDuplexProjection:
    name = "native-duplex"

    def render(self, event: ev.SessionEvent) -> dict[str, Any]:
        cls = type(event)
        out: dict[str, Any] = {
            "type": NATIVE_NAMES[cls],
            "event_id": event.event_id,
            "session_id": event.session_id,
            "epoch": event.epoch,
        }
        if isinstance(event, ev.AudioDelta):
            out.update(
                response_id=event.response_id,
                item_id=event.item_id,
                audio=encode_audio_b64(event.pcm, event.audio_format),
                format=event.audio_format,
                sample_rate_hz=event.sample_rate,
                duration_ms=round(event.duration_ms, 3),
            )
        elif isinstance(event, ev.ErrorEvent):
            out["error"] = {
                "type": event.error_type,
                "code": event.code,
                "message": event.message,
                "param": event.param,
                "event_id": event.related_event_id,
            }
        else:
            for name in _names_of(cls):
                out[name] = _plain(getattr(event, name))
        return out

    def render_text(self, event: ev.SessionEvent) -> str:
        if type(event) is ev.AudioDelta:
            return compact_json_with_blob(self.render(event), "audio")
        return compact_json(self.render(event))
