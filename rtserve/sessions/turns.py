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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rtserve import errors
from rtserve.clock import Clock
from rtserve.config import SessionLimits
from rtserve.engines.errors import EngineError
from rtserve.engines.events import InputTranscript
from rtserve.engines.events import SpeechStarted as EngineSpeechStarted
from rtserve.engines.events import SpeechStopped as EngineSpeechStopped
from rtserve.engines.protocols import EngineSession
from rtserve.engines.values import EngineCapabilities
from rtserve.sessions import events as ev
from rtserve.sessions.conversation import Conversation, ConversationItem
from rtserve.sessions.idle_timer import IdleTimeoutFired, IdleTimer
from rtserve.sessions.input_ledger import InputLedger
from rtserve.sessions.output import SessionOutput
from rtserve.sessions.responses import ResponseTracker
from rtserve.sessions.session_config import SessionConfig
from rtserve.sessions.video_frames import FrameWindow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitFinished:
    item_id: str
    error: BaseException | None


@dataclass(frozen=True)
class TranscriptTimeout:
    item_id: str


class TurnTracker:
    """Commits user turns and follows each one to its final transcript; reacts to server VAD."""

    def __init__(
        self,
        *,
        engine: EngineSession,
        capabilities: EngineCapabilities,
        config: Callable[[], SessionConfig],
        limits: SessionLimits,
        clock: Clock,
        conversation: Conversation,
        output: SessionOutput,
        ledger: InputLedger,
        responses: ResponseTracker,
        frames: FrameWindow,
        post: Callable[[object], None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._engine = engine
        self._capabilities = capabilities
        self._config = config
        self._limits = limits
        self._clock = clock
        self._conversation = conversation
        self._output = output
        self._ledger = ledger
        self._responses = responses
        self._frames = frames  # camera frames since the last user turn: this turn's images
        self._post = post  # into the runner's mailbox: completions come back in order
        self._spawn = spawn
        self._transcript_timers: dict[str, asyncio.Task[None]] = {}
        self.idle = IdleTimer(clock=clock, post=post, spawn=spawn)  # server_vad ``idle_timeout_ms``

    def commit(self, *, response_create: bool) -> None:
        self.idle.disarm()
        item_id, audio_ms = self._ledger.commit()
        turn_id = self._ledger.turn_id
        item = ConversationItem(item_id, "user", "audio", text=None, turn_id=turn_id, audio_ms=audio_ms)
        previous = self._conversation.add(item)
        self._conversation.show(item, self._frames.take())
        session_id = self._output.session_id
        self._output.emit(
            ev.InputCommitted(session_id=session_id, item_id=item_id, previous_item_id=previous, turn_id=turn_id)
        )
        self._output.emit(ev.ItemAdded(session_id=session_id, item=item.snapshot(), previous_item_id=previous))
        self._spawn(self._finish_commit(item_id))
        if response_create:
            self._responses.begin_after_turn()

    def on_commit_finished(self, done: CommitFinished) -> None:
        if done.item_id not in self._ledger.awaiting_transcripts:
            return
        if done.error is not None:
            code = done.error.code if isinstance(done.error, EngineError) else errors.ENGINE_ERROR
            self._output.error(code, "Transcribing the committed audio failed", error_type=errors.SERVER_ERROR)
            self.resolve_transcript(done.item_id, "")
        else:
            # The engine queues the final transcript before commit_input returns; this
            # timer only bounds an engine that never sends one.
            self._transcript_timers[done.item_id] = self._spawn(self._transcript_timeout(done.item_id))

    def on_transcript_timeout(self, timeout: TranscriptTimeout) -> None:
        if timeout.item_id in self._ledger.awaiting_transcripts:
            log.warning("no final transcript for %s; continuing without it", timeout.item_id)
            self.resolve_transcript(timeout.item_id, "")

    def resolve_transcript(self, item_id: str, text: str) -> None:
        self._ledger.awaiting_transcripts.remove(item_id)
        timer = self._transcript_timers.pop(item_id, None)
        if timer is not None:
            timer.cancel()
        item = self._conversation.get(item_id)
        if item is not None:
            item.text = text
        if item is not None and self._config().transcription_model is not None:
            self._output.emit(
                ev.InputTranscriptCompleted(
                    session_id=self._output.session_id,
                    item_id=item_id,
                    transcript=text,
                    audio_seconds=item.audio_ms / 1000.0,
                )
            )
        self._responses.start_engine_response()

    def on_response_finished(self, status: str, audio_ms: float) -> None:
        """A response ended: with ``idle_timeout_ms`` set, the silence after its playback is timed."""
        vad = self._config().turn_detection
        if status == "completed" and vad is not None and vad.type == "server_vad" and vad.idle_timeout_ms:
            self.idle.arm(vad.idle_timeout_ms, audio_ms)
        else:
            self.idle.disarm()

    def on_idle_timeout(self, fired: IdleTimeoutFired) -> None:
        """No speech for ``idle_timeout_ms`` after the agent finished: say so, commit what the
        buffer holds (maybe nothing) and answer, as OpenAI does."""
        vad = self._config().turn_detection
        if (
            not self.idle.is_current(fired)
            or vad is None
            or vad.type != "server_vad"
            or not vad.idle_timeout_ms
            or self._responses.active is not None
        ):
            return
        ledger = self._ledger
        item_id = ledger.speech_item()  # the item the commit below creates
        self._output.emit(
            ev.InputTimeoutTriggered(
                session_id=self._output.session_id,
                audio_start_ms=int(ledger.received_ms - ledger.uncommitted_ms),
                audio_end_ms=int(ledger.received_ms),
                item_id=item_id,
            )
        )
        self.commit(response_create=True)

    def on_speech_started(self, e: EngineSpeechStarted) -> None:
        vad = self._config().turn_detection
        if vad is None:
            return
        self.idle.disarm()
        session_id = self._output.session_id
        self._output.emit(
            ev.SpeechStarted(session_id=session_id, audio_start_ms=e.audio_ms, item_id=self._ledger.speech_item())
        )
        if self._responses.active is None and not self._output.playing():
            return  # nothing is playing: an ordinary turn start
        policy = "barge_in_on_speech" if vad.interrupt_response else "listen"
        if vad.interrupt_response and self._capabilities.supports_barge_in:
            self._output.emit(
                ev.OverlapDecided(session_id=session_id, action="barge_in", reason="server_vad", policy=policy)
            )
            self._responses.interrupt("barge_in", source="server_vad")
        else:
            reason = "interrupt_disabled" if not vad.interrupt_response else errors.BARGE_IN_UNSUPPORTED
            self._output.emit(ev.OverlapDecided(session_id=session_id, action="listen", reason=reason, policy=policy))

    def on_speech_stopped(self, e: EngineSpeechStopped) -> None:
        vad = self._config().turn_detection
        if vad is None:
            return
        self._output.emit(
            ev.SpeechStopped(
                session_id=self._output.session_id, audio_end_ms=e.audio_ms, item_id=self._ledger.speech_item()
            )
        )
        if not self._responses.continuous:
            self.commit(response_create=vad.create_response)

    def on_input_transcript(self, e: InputTranscript) -> None:
        awaiting = self._ledger.awaiting_transcripts
        if e.final:
            if awaiting:
                self.resolve_transcript(awaiting[0], e.text)
            return
        if self._config().transcription_model is None:
            return  # transcription events off (``transcription: null``)
        item_id = awaiting[0] if awaiting else self._ledger.speech_item()
        self._output.emit(ev.InputTranscriptDelta(session_id=self._output.session_id, item_id=item_id, delta=e.text))

    async def _finish_commit(self, item_id: str) -> None:
        try:
            await self._engine.commit_input()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - posted to the runner, which reports it
            self._post(CommitFinished(item_id, exc))
            return
        self._post(CommitFinished(item_id, None))

    async def _transcript_timeout(self, item_id: str) -> None:
        await self._clock.sleep(self._limits.input_transcript_timeout_s)
        self._post(TranscriptTimeout(item_id))
