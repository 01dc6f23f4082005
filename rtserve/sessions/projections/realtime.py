"""OpenAI Realtime rendering of session events.

``naming="ga"`` uses the GA event names and shapes (``response.output_audio.delta``,
``conversation.item.added``, ``session.audio.output.format``); ``naming="beta"`` the
older names still used by many clients (``response.audio.delta``,
``conversation.item.created``, ``output_audio_format``). With ``duplex=True`` every
event also carries the session ``epoch`` (the ``/v1/realtime?duplex=1`` extensions,
docs/sessions.md#duplex-extensions); events with no OpenAI equivalent keep their duplex names
(``session.heartbeat_ack``, ``session.resumed``, ``overlap.decision``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from rtserve.errors import INVALID_REQUEST_ERROR, SESSION_EXPIRED
from rtserve.sessions import events as ev
from rtserve.sessions.lease import MAX_DURATION_REACHED
from rtserve.sessions.projections.audio import encode_audio_b64
from rtserve.sessions.projections.base import SESSION_EVENT_NAMES, compact_json, compact_json_with_blob
from rtserve.sessions.session_config import SessionConfig

Naming = Literal["ga", "beta"]

_GA_NAMES: dict[type[ev.SessionEvent], str] = {
    **SESSION_EVENT_NAMES,
    ev.SpeechStarted: "input_audio_buffer.speech_started",
    ev.SpeechStopped: "input_audio_buffer.speech_stopped",
    ev.InputCommitted: "input_audio_buffer.committed",
    ev.InputCleared: "input_audio_buffer.cleared",
    ev.InputTimeoutTriggered: "input_audio_buffer.timeout_triggered",
    ev.InputTranscriptDelta: "conversation.item.input_audio_transcription.delta",
    ev.InputTranscriptCompleted: "conversation.item.input_audio_transcription.completed",
    ev.ItemAdded: "conversation.item.added",
    ev.ItemDone: "conversation.item.done",
    ev.ItemDeleted: "conversation.item.deleted",
    ev.ItemTruncated: "conversation.item.truncated",
    ev.ItemRetrieved: "conversation.item.retrieved",
    ev.ResponseCreated: "response.created",
    ev.OutputItemAdded: "response.output_item.added",
    ev.OutputItemDone: "response.output_item.done",
    ev.ContentPartAdded: "response.content_part.added",
    ev.ContentPartDone: "response.content_part.done",
    ev.AudioDelta: "response.output_audio.delta",
    ev.TranscriptDelta: "response.output_audio_transcript.delta",
    ev.TextDelta: "response.output_text.delta",
    ev.AudioDone: "response.output_audio.done",
    ev.TranscriptDone: "response.output_audio_transcript.done",
    ev.TextDone: "response.output_text.done",
    ev.ResponseDone: "response.done",
    ev.FunctionCallArgumentsDelta: "response.function_call_arguments.delta",
    ev.FunctionCallArgumentsDone: "response.function_call_arguments.done",
    ev.RateLimitsUpdated: "rate_limits.updated",
    ev.OverlapDecided: "overlap.decision",
    ev.ResponseListen: "response.listen",
    ev.ResponseSpeak: "response.speak",
    ev.RuntimeControl: "runtime.control",
    ev.OutputAudioCleared: "output_audio_buffer.cleared",
    ev.PlaybackAcknowledged: "playback.acknowledged",
}

_BETA_RENAMES: dict[type[ev.SessionEvent], str] = {
    ev.ItemAdded: "conversation.item.created",
    ev.AudioDelta: "response.audio.delta",
    ev.TranscriptDelta: "response.audio_transcript.delta",
    ev.TextDelta: "response.text.delta",
    ev.AudioDone: "response.audio.done",
    ev.TranscriptDone: "response.audio_transcript.done",
    ev.TextDone: "response.text.done",
}

_INPUT_RATE = 24000  # OpenAI pcm16 input is 24 kHz; transports resample to the engine rate


def _ga_format(audio_format: str, rate: int) -> dict[str, Any]:
    if audio_format == "g711_ulaw":
        return {"type": "audio/pcmu"}
    if audio_format == "g711_alaw":
        return {"type": "audio/pcma"}
    if audio_format == "pcm_f32le":
        return {"type": "audio/pcm-f32le", "rate": rate}
    return {"type": "audio/pcm", "rate": rate}


def _transcription(config: SessionConfig) -> dict[str, Any] | None:
    return None if config.transcription_model is None else {"model": config.transcription_model}


def _turn_detection(config: SessionConfig) -> dict[str, Any] | None:
    """OpenAI's shape of each type: ``semantic_vad`` has eagerness and no VAD tuning; unset
    optional fields are left out."""
    vad = config.turn_detection
    if vad is None:
        return None
    if vad.type == "semantic_vad":
        return {
            "type": "semantic_vad",
            "eagerness": vad.eagerness or "auto",
            "create_response": vad.create_response,
            "interrupt_response": vad.interrupt_response,
        }
    return vad.model_dump(exclude={"eagerness"}, exclude_none=True)


class RealtimeProjection:
    """Renders typed events as OpenAI Realtime JSON for one connection."""

    def __init__(self, naming: Naming = "ga", *, duplex: bool = False) -> None:
        if naming not in ("ga", "beta"):
            raise ValueError(f"naming must be 'ga' or 'beta', got {naming!r}")
        self.naming = naming
        self.duplex = duplex
        self.name = f"realtime-{naming}{'-duplex' if duplex else ''}"
        self._names = dict(_GA_NAMES)
        if naming == "beta":
            self._names.update(_BETA_RENAMES)
        self._fields: dict[type[ev.SessionEvent], Callable[[Any], dict[str, Any]]] = {
            ev.SessionCreated: self._session_created,
            ev.SessionUpdated: lambda e: {"session": self._session(e.session)},
            ev.HeartbeatAck: lambda e: {"session_id": e.session_id},
            ev.SessionClosed: _terminal,
            ev.SessionExpired: _terminal,
            ev.SessionResumed: lambda e: {
                "session_id": e.session_id,
                "attachment_generation": e.attachment_generation,
                "resume_token": e.resume_token,
                "replayed": e.replayed,
            },
            ev.SessionReplaced: lambda e: {
                "session_id": e.session_id,
                "attachment_generation": e.attachment_generation,
            },
            ev.ResyncRequired: lambda e: {"session_id": e.session_id, "reason": e.reason},
            ev.ErrorEvent: _error,
            ev.SpeechStarted: lambda e: {"audio_start_ms": e.audio_start_ms, "item_id": e.item_id},
            ev.SpeechStopped: lambda e: {"audio_end_ms": e.audio_end_ms, "item_id": e.item_id},
            ev.InputCommitted: lambda e: {
                "previous_item_id": e.previous_item_id,
                "item_id": e.item_id,
                "turn_id": e.turn_id,
            },
            ev.InputCleared: lambda e: {},
            ev.InputTimeoutTriggered: lambda e: {
                "audio_start_ms": e.audio_start_ms,
                "audio_end_ms": e.audio_end_ms,
                "item_id": e.item_id,
            },
            ev.InputTranscriptDelta: lambda e: {
                "item_id": e.item_id,
                "content_index": e.content_index,
                "delta": e.delta,
            },
            ev.InputTranscriptCompleted: lambda e: {
                "item_id": e.item_id,
                "content_index": e.content_index,
                "transcript": e.transcript,
                "usage": {"type": "duration", "seconds": round(e.audio_seconds, 3)},
            },
            ev.ItemAdded: lambda e: {"previous_item_id": e.previous_item_id, "item": self._item(e.item)},
            ev.ItemDone: lambda e: {"previous_item_id": e.previous_item_id, "item": self._item(e.item)},
            ev.ItemDeleted: lambda e: {"item_id": e.item_id},
            ev.ItemTruncated: lambda e: {
                "item_id": e.item_id,
                "content_index": e.content_index,
                "audio_end_ms": e.audio_end_ms,
            },
            ev.ItemRetrieved: lambda e: {"item": self._item(e.item)},
            ev.ResponseCreated: self._response_created,
            ev.OutputItemAdded: lambda e: {
                "response_id": e.response_id,
                "output_index": e.output_index,
                "item": self._item(e.item),
            },
            ev.OutputItemDone: lambda e: {
                "response_id": e.response_id,
                "output_index": e.output_index,
                "item": self._item(e.item),
            },
            ev.ContentPartAdded: lambda e: {**_part_ids(e), "part": _content_part(e.kind, "")},
            ev.ContentPartDone: lambda e: {**_part_ids(e), "part": _content_part(e.kind, e.text)},
            ev.AudioDelta: lambda e: {
                **_part_ids(e),
                "delta": encode_audio_b64(e.pcm, e.audio_format),
                "sample_rate_hz": e.sample_rate,
            },
            ev.TranscriptDelta: lambda e: {**_part_ids(e), "delta": e.delta},
            ev.TextDelta: lambda e: {**_part_ids(e), "delta": e.delta},
            ev.AudioDone: _part_ids,
            ev.TranscriptDone: lambda e: {**_part_ids(e), "transcript": e.transcript},
            ev.TextDone: lambda e: {**_part_ids(e), "text": e.text},
            ev.ResponseDone: self._response_done,
            ev.FunctionCallArgumentsDelta: lambda e: {
                "response_id": e.response_id,
                "item_id": e.item_id,
                "output_index": e.output_index,
                "call_id": e.call_id,
                "delta": e.delta,
            },
            ev.FunctionCallArgumentsDone: lambda e: {
                "response_id": e.response_id,
                "item_id": e.item_id,
                "output_index": e.output_index,
                "call_id": e.call_id,
                "name": e.name,
                "arguments": e.arguments,
            },
            ev.RateLimitsUpdated: lambda e: {"rate_limits": [dict(r) for r in e.rate_limits]},
            ev.ResponseListen: lambda e: {
                "session_id": e.session_id,
                "response": {"status": "listening", "metadata": {"reason": e.reason}},
            },
            ev.ResponseSpeak: lambda e: {
                "response_id": e.response_id,
                "item_id": e.item_id,
                "output_index": 0,
                "content_index": 0,
                "text": e.text,
                "metadata": {"session_id": e.session_id, "model_speak": False},
            },
            ev.RuntimeControl: lambda e: {"session_id": e.session_id, "result": dict(e.result)},
            ev.OverlapDecided: lambda e: {
                "session_id": e.session_id,
                "policy": e.policy,
                "action": e.action,
                "reason": e.reason,
                "overlap_ms": e.overlap_ms,
            },
            ev.OutputAudioCleared: lambda e: {"response_id": e.response_id},
            ev.PlaybackAcknowledged: lambda e: {
                "response_id": e.response_id,
                "item_id": e.item_id,
                "played_ms": e.played_ms,
                "committed_ms": e.committed_ms,
                "history_committed": e.history_committed,
            },
        }

    def render(self, event: ev.SessionEvent) -> dict[str, Any]:
        cls = type(event)
        if isinstance(event, ev.SessionExpired) and not self.duplex and event.reason == MAX_DURATION_REACHED:
            return _max_duration_error(event)
        out: dict[str, Any] = {"type": self._names[cls], "event_id": event.event_id}
        out.update(self._fields[cls](event))
        if self.duplex:
            out["epoch"] = event.epoch
        return out

    def render_text(self, event: ev.SessionEvent) -> str:
        if type(event) is ev.AudioDelta:
            return compact_json_with_blob(self.render(event), "delta")
        return compact_json(self.render(event))

    # -- pieces -------------------------------------------------------------

    def _session(self, s: ev.SessionSnapshot) -> dict[str, Any]:
        c = s.config
        model = c.model or str(s.capabilities.get("engine", ""))
        if self.naming == "ga":
            body: dict[str, Any] = {
                "type": "realtime",
                "object": "realtime.session",
                "id": s.id,
                "model": model,
                "output_modalities": list(c.modalities),
                "instructions": c.instructions,
                "audio": {
                    "input": {
                        "format": _ga_format(c.input_audio_format, _INPUT_RATE),
                        "turn_detection": _turn_detection(c),
                        "transcription": _transcription(c),
                    },
                    "output": {
                        "format": _ga_format(c.output_audio_format, c.output_sample_rate),
                        "voice": c.voice,
                        "speed": 1.0,
                    },
                },
                "max_output_tokens": c.max_output_tokens,
            }
        else:
            body = {
                "id": s.id,
                "object": "realtime.session",
                "model": model,
                "modalities": list(c.modalities),
                "instructions": c.instructions,
                "voice": c.voice,
                "input_audio_format": c.input_audio_format,
                "output_audio_format": c.output_audio_format,
                "turn_detection": _turn_detection(c),
                "temperature": c.temperature,
                "max_response_output_tokens": c.max_output_tokens,
            }
        body.update(_tools(c))
        body.update(
            {
                "epoch": s.epoch,
                "turn_id": s.turn_id,
                "temperature": c.temperature,
                "output_sample_rate": c.output_sample_rate,
                "playback_commit_policy": c.playback_commit_policy,
                "capabilities": {**s.capabilities, "supports_session_resume": s.resumable},
            }
        )
        return body

    def _session_created(self, e: ev.SessionCreated) -> dict[str, Any]:
        return {
            "session": self._session(e.session),
            "attachment_generation": e.attachment_generation,
            "resume_token": e.resume_token,
        }

    def _part(self, kind: str, role: str, text: str | None) -> dict[str, Any]:
        if role == "assistant":
            if kind == "audio":
                return {"type": "output_audio" if self.naming == "ga" else "audio", "transcript": text}
            return {"type": "output_text" if self.naming == "ga" else "text", "text": text}
        if kind == "audio":
            return {"type": "input_audio", "transcript": text}
        return {"type": "input_text", "text": text}

    def _item(self, item: ev.ItemSnapshot) -> dict[str, Any]:
        if item.kind == "function_call":
            return {
                "id": item.id,
                "object": "realtime.item",
                "type": "function_call",
                "status": item.status,
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.text or "",
            }
        if item.kind == "function_call_output":
            return {
                "id": item.id,
                "object": "realtime.item",
                "type": "function_call_output",
                "status": item.status,
                "call_id": item.call_id,
                "output": item.text or "",
            }
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "message",
            "status": item.status,
            "role": item.role,
            "content": [self._part(item.kind, item.role, item.text)],
        }

    def _modalities_key(self) -> str:
        return "output_modalities" if self.naming == "ga" else "modalities"

    def _response_created(self, e: ev.ResponseCreated) -> dict[str, Any]:
        return {
            "response_id": e.response_id,
            "response": {
                "id": e.response_id,
                "object": "realtime.response",
                "status": "in_progress",
                "status_details": None,
                "output": [],
                self._modalities_key(): list(e.modalities),
                "metadata": dict(e.metadata) or None,
                "usage": None,
            },
        }

    def _response_done(self, e: ev.ResponseDone) -> dict[str, Any]:
        # OpenAI metadata holds client strings; the history flag is a duplex extension.
        metadata = {**e.metadata, "committed": e.committed} if self.duplex else (dict(e.metadata) or None)
        return {
            "response_id": e.response_id,
            "response": {
                "id": e.response_id,
                "object": "realtime.response",
                "status": e.status,
                "status_details": self._status_details(e.status_details),
                "output": [self._item(item) for item in e.output],
                "usage": None if e.usage is None else dict(e.usage),
                "metadata": metadata,
            },
        }

    def _status_details(self, details: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Duplex clients get the runtime's own reasons; OpenAI clients validate a closed set
        (``turn_detected``, ``client_cancelled``, ...), so cancellations are named in its words,
        and a failure's reason goes in ``error`` (a code such as ``output_backpressure``, or a
        message), where OpenAI's schema has it."""
        if details is None:
            return None
        kind = details.get("type")
        if self.duplex or kind not in ("cancelled", "failed"):
            return dict(details)
        if kind == "failed":
            why = str(details.get("reason") or "")
            if not why:
                return {"type": "failed"}
            return {"type": "failed", "error": {"code": why} if why.isidentifier() else {"message": why}}
        reason = _OPENAI_CANCEL_REASONS.get(details.get("reason", ""))
        return {"type": "cancelled", "reason": reason} if reason else {"type": "cancelled"}


# Why a response was cancelled -> the reason OpenAI's schema has for it.
_OPENAI_CANCEL_REASONS = {
    "barge_in": "turn_detected",
    "client_cancelled": "client_cancelled",
    "output_cleared": "client_cancelled",
}


def _tools(config: SessionConfig) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` as the client set them (OpenAI's realtime shapes)."""
    choice = config.tool_choice
    return {
        "tools": [
            {"type": "function", "name": t.name, "description": t.description, "parameters": dict(t.parameters)}
            for t in config.tools
        ],
        "tool_choice": {"type": "function", "name": choice.name} if choice.name else choice.mode,
    }


def _content_part(kind: str, text: str) -> dict[str, Any]:
    """``response.content_part.*`` parts are ``audio``/``text`` in both GA and beta."""
    return {"type": "audio", "transcript": text} if kind == "audio" else {"type": "text", "text": text}


def _part_ids(e: ev.ResponsePartEvent) -> dict[str, Any]:
    return {
        "response_id": e.response_id,
        "item_id": e.item_id,
        "output_index": e.output_index,
        "content_index": e.content_index,
    }


def _terminal(e: ev.SessionClosed | ev.SessionExpired) -> dict[str, Any]:
    out: dict[str, Any] = {"session_id": e.session_id, "reason": e.reason}
    if e.details:
        out["details"] = dict(e.details)
    return out


def _max_duration_error(e: ev.SessionExpired) -> dict[str, Any]:
    """What OpenAI sends when a session reaches its maximum duration (the socket closes after it)."""
    minutes = f"{round(float(e.details.get('max_duration_s', 3600)) / 60, 2):g}"
    return {
        "type": "error",
        "event_id": e.event_id,
        "error": {
            "type": INVALID_REQUEST_ERROR,
            "code": SESSION_EXPIRED,
            "message": f"Your session hit the maximum duration of {minutes} minutes.",
            "param": None,
            "event_id": None,
        },
    }


def _error(e: ev.ErrorEvent) -> dict[str, Any]:
    return {
        "error": {
            "type": e.error_type,
            "code": e.code,
            "message": e.message,
            "param": e.param,
            "event_id": e.related_event_id,
        }
    }
