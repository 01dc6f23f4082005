"""User turns: commits, final transcripts, and server-VAD turn detection.

A committed turn waits for its final transcript (the engine emits it from
``commit_input``) before a response that needs it is started; a transcript that never
comes is bounded by ``input_transcript_timeout_s`` on the injected clock. With server
VAD, speech over agent output barges in (``interrupt_response``) or is kept for the next
turn, and the end of speech commits the turn.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from rtserve.engines.protocols import (EngineError, EngineFailure, InputTranscript, OutputAudio, OutputText,
                                       ResponseFinished)
from rtserve.engines.protocols import SpeechStarted as EngineSpeechStarted
from rtserve.engines.protocols import SpeechStopped as EngineSpeechStopped
from rtserve.sessions import errors
from rtserve.sessions import events as ev
from rtserve.sessions.conversation import ConversationItem
from rtserve.sessions.ids import new_item_id
from rtserve.sessions.responses import ResponseFlow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _CommitFinished:
    item_id: str
    error: BaseException | None


@dataclass(frozen=True)
class _TranscriptTimeout:
    item_id: str


ENGINE_EVENTS = (OutputAudio, OutputText, ResponseFinished, EngineSpeechStarted, EngineSpeechStopped,
                 InputTranscript, EngineFailure)


class TurnFlow(ResponseFlow):
    def _commit_turn(self, *, response_create: bool) -> None:
        item_id = self._speech_item_id or new_item_id()
        self._speech_item_id = None
        self.turn_id += 1
        item = ConversationItem(item_id, "user", "audio", text=None, turn_id=self.turn_id,
                                audio_ms=self._uncommitted_ms)
        self._uncommitted_ms = 0.0
        previous = self.conversation.add(item)
        self._emit(ev.InputCommitted(session_id=self.session_id, item_id=item_id, previous_item_id=previous,
                                     turn_id=self.turn_id))
        self._emit(ev.ItemAdded(session_id=self.session_id, item=item.snapshot(), previous_item_id=previous))
        self._awaiting_transcripts.append(item_id)
        self._spawn(self._finish_commit(item_id))
        if response_create:
            if self.active is None:
                self._begin_response(None)
            else:
                self._deferred_response = True  # promoted when the active response ends

    async def _finish_commit(self, item_id: str) -> None:
        try:
            await self.engine.commit_input()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.mailbox.post(_CommitFinished(item_id, exc))
            return
        self.mailbox.post(_CommitFinished(item_id, None))

    async def _transcript_timeout(self, item_id: str) -> None:
        await self.clock.sleep(self.limits.input_transcript_timeout_s)
        self.mailbox.post(_TranscriptTimeout(item_id))

    def _on_internal(self, item: Any) -> None:
        if isinstance(item, _CommitFinished):
            if item.item_id not in self._awaiting_transcripts:
                return
            if item.error is not None:
                code = item.error.code if isinstance(item.error, EngineError) else errors.ENGINE_ERROR
                self._error(code, "Transcribing the committed audio failed", error_type=errors.SERVER_ERROR)
                self._resolve_transcript(item.item_id, "")
            else:
                # The engine queues the final transcript before commit_input returns; this
                # timer only bounds an engine that never sends one.
                self._transcript_timers[item.item_id] = self._spawn(self._transcript_timeout(item.item_id))
        elif isinstance(item, _TranscriptTimeout):
            if item.item_id in self._awaiting_transcripts:
                log.warning("no final transcript for %s; continuing without it", item.item_id)
                self._resolve_transcript(item.item_id, "")
        elif isinstance(item, ENGINE_EVENTS):
            self._on_engine_event(item)

    def _resolve_transcript(self, item_id: str, text: str) -> None:
        self._awaiting_transcripts.remove(item_id)
        timer = self._transcript_timers.pop(item_id, None)
        if timer is not None:
            timer.cancel()
        item = self.conversation.get(item_id)
        if item is not None:
            item.text = text
            self._emit(ev.InputTranscriptCompleted(session_id=self.session_id, item_id=item_id, transcript=text,
                                                   audio_seconds=item.audio_ms / 1000.0))
        self._maybe_start_engine_response()

    def _on_engine_event(self, e: Any) -> None:
        if isinstance(e, OutputAudio | OutputText | ResponseFinished):
            response = self._current_for(e.epoch, e.response_id)
            if response is None:
                self.metrics.stale_outputs.inc()
                return
            if isinstance(e, OutputAudio):
                if response.audio:
                    self._emit_audio(response, e.pcm, e.text)
            elif isinstance(e, OutputText):
                self._emit_text(response, e.text)
            elif not response.continuous:
                details = None if e.status == "completed" else {"type": e.status, "reason": e.reason}
                self._end_response(e.status, details, dict(e.usage) or None)
        elif isinstance(e, EngineSpeechStarted):
            self._on_speech_started(e)
        elif isinstance(e, EngineSpeechStopped):
            self._on_speech_stopped(e)
        elif isinstance(e, InputTranscript):
            self._on_input_transcript(e)
        elif isinstance(e, EngineFailure):
            self._error(e.code, e.message, error_type=errors.SERVER_ERROR)

    def _on_speech_started(self, e: EngineSpeechStarted) -> None:
        vad = self.config.turn_detection
        if vad is None:
            return
        self._speech_item_id = self._speech_item_id or new_item_id()
        self._emit(ev.SpeechStarted(session_id=self.session_id, audio_start_ms=e.audio_ms,
                                    item_id=self._speech_item_id))
        if self.active is None and not any(self.outlet.buffer.holds_audio(r) for r in self._audible):
            return  # nothing is playing: an ordinary turn start
        policy = "barge_in_on_speech" if vad.interrupt_response else "listen"
        if vad.interrupt_response and self.capabilities.supports_barge_in:
            self._emit(ev.OverlapDecided(session_id=self.session_id, action="barge_in", reason="server_vad",
                                         policy=policy))
            self._barge_in("server_vad")
        else:
            reason = "interrupt_disabled" if not vad.interrupt_response else "barge_in_unsupported"
            self._emit(ev.OverlapDecided(session_id=self.session_id, action="listen", reason=reason,
                                         policy=policy))

    def _on_speech_stopped(self, e: EngineSpeechStopped) -> None:
        vad = self.config.turn_detection
        if vad is None:
            return
        item_id = self._speech_item_id or new_item_id()
        self._speech_item_id = item_id
        self._emit(ev.SpeechStopped(session_id=self.session_id, audio_end_ms=e.audio_ms, item_id=item_id))
        if not self.continuous:
            self._commit_turn(response_create=vad.create_response)

    def _on_input_transcript(self, e: InputTranscript) -> None:
        if e.final:
            if self._awaiting_transcripts:
                self._resolve_transcript(self._awaiting_transcripts[0], e.text)
            return
        item_id = self._awaiting_transcripts[0] if self._awaiting_transcripts else self._speech_item_id
        if item_id is None:
            item_id = self._speech_item_id = new_item_id()
        self._emit(ev.InputTranscriptDelta(session_id=self.session_id, item_id=item_id, delta=e.text))
