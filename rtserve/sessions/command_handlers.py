"""How a runner applies each client command (docs/sessions.md#command-dispatch, docs/sessions.md#duplex-extensions).

Refusals become ``ErrorEvent``s on the session's stream with the command's
``event_id`` as ``related_event_id``; the session stays usable. Control signals (clears,
cancels, barge-in) report what they did to the engine in ``runtime.control`` when asked,
or unasked when the engine could honour them only in part. The session
configuration lives here: ``session.update`` is its only writer.
"""

from __future__ import annotations

from collections.abc import Callable

from rtserve import errors
from rtserve.config import SessionLimits
from rtserve.engines.protocols import EngineSession
from rtserve.engines.tools import InvalidTools, check_tools
from rtserve.engines.values import EngineCapabilities
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.conversation import Conversation, ConversationItem, Role
from rtserve.sessions.ids import new_item_id
from rtserve.sessions.input_ledger import InputLedger
from rtserve.sessions.output import SessionOutput
from rtserve.sessions.responses import ResponseTracker
from rtserve.sessions.session_config import ConfigUpdateError, SessionConfig, check_bounds
from rtserve.sessions.turns import TurnTracker
from rtserve.sessions.video_frames import FrameWindow

# OpenAI refuses a manual commit of less audio than this (``input_audio_buffer_commit_empty``).
MIN_COMMIT_MS = 100


class CommandHandlers:
    def __init__(
        self,
        *,
        engine: EngineSession,
        capabilities: EngineCapabilities,
        config: SessionConfig,
        limits: SessionLimits,
        conversation: Conversation,
        output: SessionOutput,
        ledger: InputLedger,
        responses: ResponseTracker,
        turns: TurnTracker,
        frames: FrameWindow,
        snapshot: Callable[[], ev.SessionSnapshot],
    ) -> None:
        self.engine = engine
        self.capabilities = capabilities
        self.config = config
        self._limits = limits
        self._conversation = conversation
        self._output = output
        self._ledger = ledger
        self._responses = responses
        self._turns = turns
        self._frames = frames
        self._snapshot = snapshot

    def apply(self, c: cmd.Command) -> None:
        if isinstance(c, cmd.AppendAudio):
            self._append(c)
        elif isinstance(c, cmd.Commit):
            self._commit(c)
        elif isinstance(c, cmd.Heartbeat):
            self._output.emit(ev.HeartbeatAck(session_id=self._output.session_id))
        elif isinstance(c, cmd.ResponseCreate):
            if self._response_tools_usable(c):
                self._response_create(c)
        elif isinstance(c, cmd.ResponseCancel):
            self._response_cancel(c)
        elif isinstance(c, cmd.Clear):
            self._clear(c)
        elif isinstance(c, cmd.BargeIn):
            if self._require_barge_in(c):
                self._interrupt("barge_in", "barge_in", source=c.source)
        elif isinstance(c, cmd.OverlapDecision):
            self._overlap_decision(c)
        elif isinstance(c, cmd.PlaybackAck):
            self._playback_ack(c)
        elif isinstance(c, cmd.SessionUpdate):
            self._session_update(c)
        elif isinstance(c, cmd.ConversationItemCreate):
            if not c.images or self._sees(c):
                self._item_create(c)
        elif isinstance(c, cmd.VideoFrame):
            if self._sees(c):
                self._frames.add(c.image)
        elif isinstance(c, cmd.FunctionItemCreate):
            self._function_item_create(c)
        elif isinstance(c, cmd.ConversationItemTruncate):
            self._item_truncate(c)
        elif isinstance(c, cmd.ConversationItemDelete):
            self._item_delete(c)
        elif isinstance(c, cmd.ConversationItemRetrieve):
            item = self._conversation.get(c.item_id)
            if item is None:
                self._item_not_found(c.item_id, c.event_id)
            else:
                self._output.emit(ev.ItemRetrieved(session_id=self._output.session_id, item=item.snapshot()))
        else:
            self._output.error(errors.INVALID_VALUE, f"{type(c).__name__} is not a session command", related=c.event_id)

    def _append(self, c: cmd.AppendAudio) -> None:
        if c.audio.size:
            self.engine.push_audio(c.audio)
            audio_ms = 1000.0 * c.audio.size / self.capabilities.input_sample_rate
            self._ledger.uncommitted_ms += audio_ms
            self._ledger.received_ms += audio_ms
        if self._responses.continuous and self._responses.active is None and not self._output.failed:
            self._responses.begin(None)

    def _commit(self, c: cmd.Commit) -> None:
        # docs/sessions.md#duplex-extensions: a declared silence is committed, and answered by listening
        if c.is_speech is False:
            if self._ledger.uncommitted_ms > 0 and not self._responses.continuous:
                self._turns.commit(response_create=False)
            self._output.emit(ev.ResponseListen(session_id=self._output.session_id, reason="silence_declared"))
            return
        buffered_ms = self._ledger.uncommitted_ms
        if buffered_ms <= 0:  # empty on any engine, with turns or not (docs/serving.md#errors)
            self._output.error(errors.INPUT_BUFFER_EMPTY, "Input audio buffer is empty", related=c.event_id)
        elif self._responses.continuous:
            self._output.error(
                errors.TURN_CONTROL_UNSUPPORTED, "This model streams continuously and has no turns", related=c.event_id
            )
        elif buffered_ms < MIN_COMMIT_MS:
            self._output.error(
                errors.INPUT_BUFFER_EMPTY,
                "Error committing input audio buffer: buffer too small. "
                f"Expected at least {MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{buffered_ms:.2f}ms of audio.",
                related=c.event_id,
            )
        else:
            self._turns.commit(response_create=c.response_create)

    def _response_create(self, c: cmd.ResponseCreate) -> None:
        if c.speak is not None and not self._speakable(c):
            return
        try:
            check_bounds(
                self._limits, instructions=c.instructions, voice=c.voice, max_output_tokens=c.max_output_tokens
            )
        except ConfigUpdateError as exc:
            self._output.error(errors.INVALID_VALUE, exc.message, related=c.event_id, param=f"response.{exc.param}")
            return
        if c.input is not None and not self._input_within_bounds(c.input):
            self._output.error(
                errors.CONVERSATION_LIMIT_EXCEEDED,
                "response.input exceeds the conversation limits "
                f"({self._limits.max_conversation_items} items, {self._limits.max_conversation_bytes} "
                "bytes)",
                related=c.event_id,
                param="response.input",
            )
        elif self._responses.continuous:
            self._output.error(
                errors.TURN_CONTROL_UNSUPPORTED, "This model has one continuous response", related=c.event_id
            )
        elif self._responses.active is not None:
            self._output.error(
                errors.RESPONSE_ALREADY_ACTIVE,
                f"Conversation already has an active response in progress: {self._responses.active.id}",
                related=c.event_id,
            )
        else:
            self._responses.begin(c)

    def _speakable(self, c: cmd.ResponseCreate) -> bool:
        """``response.speak`` needs an engine that can be made to say given text, within bounds."""
        assert c.speak is not None
        if not self.capabilities.supports_speak:
            self._output.error(
                errors.RESPONSE_SPEAK_UNSUPPORTED,
                "This model produces its own speech and cannot be made to say given text",
                related=c.event_id,
            )
            return False
        if len(c.speak) > self._limits.max_speak_chars:
            self._output.error(
                errors.INVALID_VALUE,
                f"text is longer than {self._limits.max_speak_chars} characters",
                related=c.event_id,
                param="text",
            )
            return False
        return True

    def _input_within_bounds(self, items: tuple[cmd.ResponseInput, ...]) -> bool:
        """An out-of-band context is held to the bounds of a conversation."""
        held = sum(len(entry.text.encode()) for entry in items)
        return len(items) <= self._limits.max_conversation_items and held <= self._limits.max_conversation_bytes

    def _response_cancel(self, c: cmd.ResponseCancel) -> None:
        active = self._responses.active
        if active is None or (c.response_id is not None and c.response_id != active.id):
            self._output.error(errors.RESPONSE_NOT_ACTIVE, "No active response to cancel", related=c.event_id)
            return
        self._interrupt("cancel_response", "client_cancelled")

    def _clear(self, c: cmd.Clear) -> None:
        if c.target == "input":
            self.engine.clear_input()
            self._ledger.clear_uncommitted()
            self._output.emit(ev.InputCleared(session_id=self._output.session_id))
            self._control_result("clear_input", ["input_cleared"])
            return
        self._interrupt("clear_output", "output_cleared")

    def _interrupt(self, signal: str, reason: str, **details: str) -> None:
        """Advance the epoch and cancel the active response; a lockstep model's eternal stream
        keeps flowing (it cannot be stopped or rewound), which ``runtime.control`` reports."""
        active = self._responses.active is not None and not self._responses.continuous
        self._responses.interrupt(reason, **details)
        applied = ["epoch_advanced", *(["response_cancelled"] if active else [])]
        self._control_result(signal, applied, ("stop_output",) if self._responses.continuous else ())

    def _control_result(self, signal: str, applied: list[str], unsupported: tuple[str, ...] = ()) -> None:
        """``runtime.control`` (docs/sessions.md#duplex-extensions): after a signal the engine honoured only in part,
        or after every signal when the session asked (``emit_duplex_control_results``)."""
        if unsupported or self.config.emit_control_results:
            self._output.emit(
                ev.RuntimeControl(
                    session_id=self._output.session_id,
                    result={
                        "signal": signal,
                        "ok": not unsupported,
                        "applied": applied,
                        "unsupported": list(unsupported),
                    },
                )
            )

    def _require_barge_in(self, c: cmd.Command) -> bool:
        if self.capabilities.supports_barge_in:
            return True
        self._output.error(errors.BARGE_IN_UNSUPPORTED, "This model does not support barge-in", related=c.event_id)
        return False

    def _overlap_decision(self, c: cmd.OverlapDecision) -> None:
        if c.action == "barge_in" and not self._require_barge_in(c):
            return
        self._output.emit(
            ev.OverlapDecided(
                session_id=self._output.session_id,
                action=c.action,
                reason="client_decision",
                policy="client",
                overlap_ms=c.overlap_ms,
            )
        )
        if c.action == "barge_in":
            self._interrupt("barge_in", "barge_in", source="client_decision")
        elif c.action == "drop":
            self._clear(cmd.Clear(target="input"))

    def _playback_ack(self, c: cmd.PlaybackAck) -> None:
        item = self._conversation.for_response(c.response_id)
        if item is None:
            self._output.error(
                errors.UNKNOWN_RESPONSE,
                f"No response {c.response_id} in this conversation",
                related=c.event_id,
                param="response_id",
            )
            return
        committed_ms = c.played_ms if c.committed_ms is None else c.committed_ms
        policy = self.config.playback_commit_policy
        if policy == "ack_only" and item.turn_id < self._ledger.turn_id and committed_ms > item.committed_ms:
            # A newer user turn is committed: extending this answer now would put it after that turn.
            self._output.error(
                errors.PLAYBACK_ACK_OUT_OF_ORDER,
                "Acknowledge playback before committing the next input",
                related=c.event_id,
            )
            return
        changed = item.acknowledge(c.played_ms, committed_ms, policy)
        if c.truncate:
            item.truncate(item.played_ms)
            changed = True
        self._output.emit(
            ev.PlaybackAcknowledged(
                session_id=self._output.session_id,
                response_id=c.response_id,
                item_id=item.id,
                played_ms=item.played_ms,
                committed_ms=item.committed_ms,
                history_committed=changed,
            )
        )

    def _session_update(self, c: cmd.SessionUpdate) -> None:
        try:
            config = self.config.updated(dict(c.changes), self._limits)
        except ConfigUpdateError as exc:
            self._output.error(errors.INVALID_VALUE, exc.message, related=c.event_id, param=exc.param)
            return
        if config.tools and not self.capabilities.supports_tools:  # not accepted only to be ignored
            self._output.error(
                errors.INVALID_VALUE,
                f"The {self.capabilities.name} engine cannot call functions; "
                "tools need an engine with supports_tools (the cascade)",
                related=c.event_id,
                param="session.tools",
            )
            return
        vad = config.turn_detection
        if vad is not None and vad.type == "semantic_vad" and not self.capabilities.supports_semantic_vad:
            self._output.error(
                errors.UNSUPPORTED_TURN_DETECTION,
                f"The {self.capabilities.name} engine has no end-of-turn model for semantic_vad; use server_vad "
                "(the cascade takes it, docs/engines.md#cascade-streaming-asr)",
                related=c.event_id,
                param="session.audio.input.turn_detection",
            )
            return
        if config.turn_detection != self.config.turn_detection:
            self._configure_turn_detection(config)  # an EngineError leaves the config as it was
        self.config = config
        self._output.emit(ev.SessionUpdated(session_id=self._output.session_id, session=self._snapshot()))

    def _configure_turn_detection(self, config: SessionConfig) -> None:
        """An engine that ends turns itself (server VAD) learns the new setting; it drops the
        uncommitted turn, so the session does too."""
        if not self.capabilities.supports_server_vad:
            return
        self.engine.configure_turn_detection(config.turn_detection)
        self._ledger.clear_uncommitted()

    def _item_create(self, c: cmd.ConversationItemCreate) -> None:
        item_id = c.item_id or new_item_id()
        if item_id in self._conversation:
            self._output.error(
                errors.INVALID_VALUE, f"Item {item_id} already exists", related=c.event_id, param="item_id"
            )
            return
        if not self._conversation.admits(c.text):
            self._output.error(
                errors.CONVERSATION_LIMIT_EXCEEDED,
                f"The conversation holds at most {self._conversation.max_items} items and "
                f"{self._conversation.max_bytes} bytes of text; delete items to add more",
                related=c.event_id,
                param="item",
            )
            return
        item = ConversationItem(
            item_id,
            c.role,
            "audio" if c.audio else "text",
            text=c.text,
            committed_text=c.text,
            turn_id=self._ledger.turn_id,
        )
        self._insert_item(item, c.previous_item_id, c.event_id)
        if c.role == "user" and item.id in self._conversation:  # the frames seen since the last turn, then its own
            self._conversation.show(item, (*self._frames.take(), *c.images))

    def _sees(self, c: cmd.Command) -> bool:
        """Images need an engine that can see: transports refuse video at setup, this catches the rest."""
        if self.capabilities.supports_vision:
            return True
        self._output.error(
            errors.VISION_UNSUPPORTED,
            "This server's language model cannot see images (docs/video.md)",
            related=c.event_id,
            param="item.content" if isinstance(c, cmd.ConversationItemCreate) else None,
        )
        return False

    def _insert_item(self, item: ConversationItem, previous_item_id: str | None, event_id: str | None) -> None:
        """A client-created item into the conversation after ``previous_item_id``, announced."""
        try:
            previous = self._conversation.add(item, previous_item_id)
        except KeyError:
            self._item_not_found(previous_item_id or "", event_id, param="previous_item_id")
            return
        snapshot = item.snapshot()
        session_id = self._output.session_id
        self._output.emit(ev.ItemAdded(session_id=session_id, item=snapshot, previous_item_id=previous))
        self._output.emit(ev.ItemDone(session_id=session_id, item=snapshot, previous_item_id=previous))

    def _response_tools_usable(self, c: cmd.ResponseCreate) -> bool:
        """A response's own ``tools``/``tool_choice``, with the session's for what it leaves out,
        must be a set this engine can serve (else a typed refusal naming the response field)."""
        if c.tools is None and c.tool_choice is None:
            return True
        tools = self.config.tools if c.tools is None else c.tools
        try:
            check_tools(
                tools,
                self.config.tool_choice if c.tool_choice is None else c.tool_choice,
                "response.tools",
                max_tools=self._limits.max_tools,
                max_schema_bytes=self._limits.max_tool_schema_bytes,
            )
        except InvalidTools as exc:
            self._output.error(errors.INVALID_VALUE, exc.message, related=c.event_id, param=exc.param)
            return False
        if tools and not self.capabilities.supports_tools:
            self._output.error(
                errors.INVALID_VALUE,
                f"The {self.capabilities.name} engine cannot call functions",
                related=c.event_id,
                param="response.tools",
            )
            return False
        return True

    def _function_item_create(self, c: cmd.FunctionItemCreate) -> None:
        """A call result (or a restored call) joins the conversation; the next response sees it."""
        item_id = c.item_id or new_item_id()
        text = c.arguments if c.kind == "function_call" else c.output
        if item_id in self._conversation:
            self._output.error(
                errors.INVALID_VALUE, f"Item {item_id} already exists", related=c.event_id, param="item.id"
            )
        elif c.kind == "function_call_output" and not self._conversation.has_call(c.call_id):
            self._output.error(
                errors.INVALID_VALUE,
                f"No function call with call_id {c.call_id[:64]!r} in this conversation",
                related=c.event_id,
                param="item.call_id",
            )
        elif not self._conversation.admits(text):
            self._output.error(
                errors.CONVERSATION_LIMIT_EXCEEDED,
                f"The conversation holds at most {self._conversation.max_items} items and "
                f"{self._conversation.max_bytes} bytes of text; delete items to add more",
                related=c.event_id,
                param="item",
            )
        else:
            role: Role = "assistant" if c.kind == "function_call" else "user"
            item = ConversationItem(
                item_id, role, c.kind, text=text, turn_id=self._ledger.turn_id, call_id=c.call_id, name=c.name or None
            )
            self._insert_item(item, c.previous_item_id, c.event_id)

    def _item_truncate(self, c: cmd.ConversationItemTruncate) -> None:
        item = self._conversation.get(c.item_id)
        if item is None:
            self._item_not_found(c.item_id, c.event_id)
        elif item.role != "assistant" or item.kind != "audio":
            self._output.error(
                errors.INVALID_VALUE, "Only assistant audio items can be truncated", related=c.event_id, param="item_id"
            )
        elif c.audio_end_ms < 0 or c.audio_end_ms > item.audio_ms + 1:
            self._output.error(
                errors.INVALID_VALUE,
                f"audio_end_ms {c.audio_end_ms} is beyond the item's {int(item.audio_ms)} ms of audio",
                related=c.event_id,
                param="audio_end_ms",
            )
        else:
            item.truncate(c.audio_end_ms)
            self._output.emit(
                ev.ItemTruncated(
                    session_id=self._output.session_id,
                    item_id=item.id,
                    audio_end_ms=c.audio_end_ms,
                    content_index=c.content_index,
                )
            )

    def _item_delete(self, c: cmd.ConversationItemDelete) -> None:
        active = self._responses.active
        if active is not None and active.item.id == c.item_id:
            self._output.error(
                errors.INVALID_VALUE,
                "Cancel the response before deleting its item",
                related=c.event_id,
                param="item_id",
            )
        elif self._conversation.remove(c.item_id) is None:
            self._item_not_found(c.item_id, c.event_id)
        else:
            if c.item_id in self._ledger.awaiting_transcripts:
                self._turns.resolve_transcript(c.item_id, "")
            self._output.emit(ev.ItemDeleted(session_id=self._output.session_id, item_id=c.item_id))

    def _item_not_found(self, item_id: str, related: str | None, param: str = "item_id") -> None:
        self._output.error(errors.ITEM_NOT_FOUND, f"Item {item_id} does not exist", related=related, param=param)
