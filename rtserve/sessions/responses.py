"""Responses: creation, the epoch fence, engine output, and the completion batch.

Turn engines get one response at a time; engine output stamped with an older epoch, or
for a response that is no longer active, is dropped. Lockstep engines
(``capabilities.mode == "lockstep"``) get one eternal response, created on the first
input or output and completed once at close (docs/sessions.md#lockstep-sessions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from rtserve.codecs.resample import StreamResampler
from rtserve.engines.events import OutputAudio, OutputText, OutputToolCall, ResponseFinished
from rtserve.engines.protocols import EngineSession
from rtserve.engines.values import ChatMessage, EngineCapabilities, ResponseRequest, SamplingParams
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.conversation import Conversation, ConversationItem, Outcome
from rtserve.sessions.function_calls import ResponseCalls
from rtserve.sessions.ids import item_id_for_response, new_response_id
from rtserve.sessions.input_ledger import InputLedger
from rtserve.sessions.output import SessionOutput
from rtserve.sessions.session_config import SessionConfig

ResponseOutput = OutputAudio | OutputText | ResponseFinished | OutputToolCall


class _PartIds(TypedDict):
    """What every event about one part of a response names."""

    session_id: str
    response_id: str
    item_id: str


@dataclass(eq=False)
class ActiveResponse:
    id: str
    item: ConversationItem
    modalities: tuple[str, ...]
    overrides: cmd.ResponseCreate | None
    continuous: bool
    resampler: StreamResampler | None
    calls: ResponseCalls
    engine_started: bool = False
    spoke: bool = False  # its first audio went out (``response.speak`` precedes it, once)
    announced: bool = False  # response.created was queued: the client knows this response
    ending_queued: bool = False

    @property
    def audio(self) -> bool:
        return self.item.kind == "audio"


def sampling_for(config: SessionConfig, o: cmd.ResponseCreate | None = None) -> SamplingParams:
    """The sampling a response asks the engine for: its overrides, else the session's."""
    max_tokens = o.max_output_tokens if o and o.max_output_tokens else config.max_output_tokens
    params = SamplingParams(
        temperature=o.temperature if o and o.temperature is not None else config.temperature,
        tools=o.tools if o and o.tools is not None else config.tools,
        tool_choice=o.tool_choice if o and o.tool_choice is not None else config.tool_choice,
    )
    # "inf" leaves the engine's own cap.
    return params if max_tokens == "inf" else dataclasses.replace(params, max_tokens=int(max_tokens))


class ResponseTracker:
    """The active response of one session, from ``response.created`` to ``response.done``."""

    def __init__(
        self,
        *,
        engine: EngineSession,
        capabilities: EngineCapabilities,
        config: Callable[[], SessionConfig],
        conversation: Conversation,
        output: SessionOutput,
        ledger: InputLedger,
        stopping: Callable[[], bool],
    ) -> None:
        self._engine = engine
        self._capabilities = capabilities
        self._config = config
        self._conversation = conversation
        self._output = output
        self._ledger = ledger
        self._stopping = stopping  # the session is ending: no new response may start
        self.continuous = capabilities.mode == "lockstep"
        self.active: ActiveResponse | None = None
        self._deferred = False  # a committed turn asked for a response while one was active

    @property
    def active_id(self) -> str | None:
        return None if self.active is None else self.active.id

    def begin(self, overrides: cmd.ResponseCreate | None) -> None:
        config = self._config()
        response_id = new_response_id()
        modalities = tuple(overrides.modalities) if overrides and overrides.modalities else config.modalities
        kind: Literal["audio", "text"] = "audio" if "audio" in modalities else "text"
        item = ConversationItem(
            item_id_for_response(response_id),
            "assistant",
            kind,
            text="",
            status="in_progress",
            response_id=response_id,
            turn_id=self._ledger.turn_id,
        )
        rate_in, rate_out = self._capabilities.output_sample_rate, config.output_sample_rate
        response = ActiveResponse(
            response_id,
            item,
            modalities,
            overrides,
            self.continuous,
            StreamResampler(rate_in, rate_out) if rate_in != rate_out else None,
            ResponseCalls(response_id, self._ledger.turn_id, self._conversation, self._output),
        )
        in_conversation = not (overrides and overrides.out_of_band)
        previous = self._conversation.add(item) if in_conversation else None
        self.active = response
        metadata = dict(overrides.metadata) if overrides and overrides.metadata else {}
        session_id, emit = self._output.session_id, self._output.emit
        response.announced = emit(
            ev.ResponseCreated(session_id=session_id, response_id=response_id, modalities=modalities, metadata=metadata)
        )
        if in_conversation:
            emit(ev.ItemAdded(session_id=session_id, item=item.snapshot(), previous_item_id=previous))
        emit(ev.OutputItemAdded(session_id=session_id, response_id=response_id, item=item.snapshot()))
        emit(ev.ContentPartAdded(session_id=session_id, response_id=response_id, item_id=item.id, kind=kind))
        self.start_engine_response()

    def begin_after_turn(self) -> None:
        """A committed turn asks for an answer: now, or once the active response ends."""
        if self.active is None:
            self.begin(None)
        else:
            self._deferred = True

    def start_engine_response(self) -> None:
        """Ask the engine for the active response once no committed turn awaits its transcript."""
        response = self.active
        if response is None or response.engine_started or response.continuous or self._ledger.awaiting_transcripts:
            return
        response.engine_started = True
        config, o = self._config(), response.overrides
        instructions = o.instructions if o and o.instructions is not None else config.instructions
        messages = [ChatMessage("system", instructions)] if instructions else []
        messages.extend(self._conversation.history() if o is None or o.input is None else self._context_of(o.input))
        self._engine.respond(
            ResponseRequest(
                response_id=response.id,
                epoch=self._output.epoch,
                messages=tuple(messages),
                voice=(o.voice if o and o.voice else None) or config.voice,
                # An audio answer's text is its transcript, carried by the audio chunks: asking for
                # "text" as well would make an engine stream the same words twice.
                modalities=("audio",) if response.audio else ("text",),
                params=sampling_for(config, o),
                speak=o.speak if o else None,
            )
        )

    def _context_of(self, items: tuple[cmd.ResponseInput, ...]) -> list[ChatMessage]:
        """An out-of-band ``input``: its messages, references resolved to the items' text now."""
        out = []
        for entry in items:
            text: str | None
            if entry.item_id is None:
                role, text = entry.role, entry.text
            else:
                item = self._conversation.get(entry.item_id)
                if item is None:
                    continue  # deleted since the request was accepted
                role, text = item.role, (item.committed_text if item.role == "assistant" else item.text)
            if text:
                out.append(ChatMessage(role, text))
        return out

    def advance_epoch(self) -> None:
        """New fence: queued and held audio of the old epoch is dropped before the engine
        is told, so nothing of the old epoch can be delivered afterwards."""
        cleared = self._output.advance_epoch(self.active_id)
        self._engine.set_epoch(self._output.epoch)
        for response_id in cleared:
            self._output.emit(ev.OutputAudioCleared(session_id=self._output.session_id, response_id=response_id))

    def interrupt(self, reason: str, **details: str) -> None:
        """Advance the fence and cancel the active turn response (the eternal lockstep stream
        keeps flowing in the new epoch)."""
        self.advance_epoch()
        if self.active is not None and not self.continuous:
            self.end("cancelled", {"type": "cancelled", "reason": reason, **details})

    def end(self, status: Outcome, details: dict[str, Any] | None = None, usage: dict[str, int] | None = None) -> None:
        """The completion batch: audio/text done markers, part/item done, ``response.done``,
        ``rate_limits.updated``. Stops early if the batch overflows the buffer."""
        response = self.active
        assert response is not None
        item = response.item
        if response.resampler is not None and status == "completed":
            tail = response.resampler.flush()
            if tail.size:
                self._emit_audio(response, tail, None, resample=False)
        item.settle(status, self._config().playback_commit_policy)
        if status == "failed":
            self._conversation.remove(item.id)
        session_id, emit = self._output.session_id, self._output.emit
        ids = _PartIds(session_id=session_id, response_id=response.id, item_id=item.id)
        text = item.text or ""
        batch: list[ev.SessionEvent] = (
            [ev.AudioDone(**ids), ev.TranscriptDone(**ids, transcript=text)]
            if response.audio
            else [ev.TextDone(**ids, text=text)]
        )
        snapshot = item.snapshot()
        overrides = response.overrides
        in_conversation = not (overrides and overrides.out_of_band)
        batch += [
            ev.ContentPartDone(**ids, kind="audio" if response.audio else "text", text=text),
            ev.OutputItemDone(session_id=session_id, response_id=response.id, item=snapshot),
        ]
        if in_conversation:
            batch.append(ev.ItemDone(session_id=session_id, item=snapshot))
        batch += response.calls.finish(status)
        for event in batch:
            if not emit(event):
                return
        done = ev.ResponseDone(
            session_id=session_id,
            response_id=response.id,
            status=status,
            status_details=details,
            output=(snapshot, *response.calls.snapshots()),
            usage=usage,
            committed=in_conversation and status != "failed" and bool(item.committed_text),
            metadata=dict(overrides.metadata) if overrides and overrides.metadata else {},
        )
        if not emit(done):
            return
        response.ending_queued = True
        self.active = None
        emit(ev.RateLimitsUpdated(session_id=session_id))
        if self._deferred and not self._output.failed and not self._stopping():
            self._deferred = False
            self.begin(None)

    def cut_off(self, reason: str) -> None:
        """The session closes mid-answer: drop the turn response's queued and held audio
        (no audio-cleared notice at close) and cancel it. Finished answers keep theirs."""
        if self.continuous or self.active is None:
            return
        self._output.buffer.invalidate(self.active.id, self._output.epoch)
        if not self._output.failed:
            self.end("cancelled", {"type": "cancelled", "reason": reason})

    def fail_for_overflow(self) -> ActiveResponse | None:
        """The output overflowed: the active response fails without a completion batch, its
        queued audio is dropped, and it never enters history. Returns it for the notice."""
        response, self.active = self.active, None
        if response is not None:
            self._output.buffer.invalidate(response.id, self._output.epoch)
            self._conversation.remove(response.item.id)
            response.item.status = "incomplete"
            response.calls.finish("failed")  # its calls leave the conversation too; no events
        return response

    def on_output(self, e: ResponseOutput) -> bool:
        """Apply engine output; False when it is stale (an old epoch, or no longer active)."""
        response = self._current_for(e.epoch, e.response_id)
        if response is None:
            return False
        if isinstance(e, OutputAudio):
            if response.audio:
                self._emit_audio(response, e.pcm, e.text)
        elif isinstance(e, OutputText):
            self._emit_text(response, e.text)
        elif isinstance(e, OutputToolCall):
            response.calls.on_delta(e.delta)
        elif not response.continuous:
            details = None if e.status == "completed" else {"type": e.status, "reason": e.reason}
            self.end(e.status, details, dict(e.usage) or None)
        return True

    def _emit_audio(self, response: ActiveResponse, pcm: Any, text: str | None, *, resample: bool = True) -> None:
        item = response.item
        config = self._config()
        engine_rate, rate = self._capabilities.output_sample_rate, config.output_sample_rate
        if resample and (response.resampler.out_rate if response.resampler else engine_rate) != rate:
            # session.update changed the output rate mid-response (the eternal lockstep one too).
            response.resampler = StreamResampler(engine_rate, rate) if engine_rate != rate else None
        if resample and response.resampler is not None:
            pcm = response.resampler.process(pcm)
        ids = _PartIds(session_id=self._output.session_id, response_id=response.id, item_id=item.id)
        if pcm.size and not response.spoke and response.overrides and response.overrides.speak is not None:
            # ``response.speak`` at most once per response, before its first audio delta
            # (docs/sessions.md#duplex-extensions).
            self._output.emit(ev.ResponseSpeak(**ids, text=response.overrides.speak))
        response.spoke = response.spoke or bool(pcm.size)
        if pcm.size:
            if not self._output.emit_audio(
                ev.AudioDelta(**ids, pcm=pcm, sample_rate=rate, audio_format=config.output_audio_format)
            ):
                return
            item.audio_ms += 1000.0 * pcm.size / rate
        if text or not response.continuous:
            item.text = (item.text or "") + (text or "")
            self._output.emit(ev.TranscriptDelta(**ids, delta=text or ""))

    def _emit_text(self, response: ActiveResponse, text: str) -> None:
        item = response.item
        item.text = (item.text or "") + text
        ids = _PartIds(session_id=self._output.session_id, response_id=response.id, item_id=item.id)
        if response.audio:
            self._output.emit(ev.TranscriptDelta(**ids, delta=text))
        else:
            self._output.emit(ev.TextDelta(**ids, delta=text))

    def _current_for(self, epoch: int, response_id: str | None) -> ActiveResponse | None:
        """The response an engine output belongs to, or None when it is stale."""
        if epoch != self._output.epoch or self._output.failed:
            return None
        if self.continuous:
            if self.active is None and not self._stopping():
                self.begin(None)
            return self.active
        active = self.active
        return active if active is not None and active.id == response_id else None
