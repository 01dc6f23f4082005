"""Responses: creation, the epoch fence, engine output, and the completion batch.

Turn engines get one response at a time; engine output stamped with an older epoch, or
for a response that is no longer active, is dropped. Lockstep engines
(``capabilities.mode == "lockstep"``) get one eternal response, created on the first
input or output and completed once at close (duplex.md §2.4, §2.8).
"""

from __future__ import annotations

from typing import Any

from rtserve.codecs.resample import StreamResampler
from rtserve.engines.protocols import ChatMessage, ResponseRequest, SamplingParams
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.conversation import ConversationItem, Outcome
from rtserve.sessions.ids import item_id_for_response, new_response_id
from rtserve.sessions.runner_state import ActiveResponse, RunnerState


class ResponseFlow(RunnerState):
    def _begin_response(self, overrides: cmd.ResponseCreate | None) -> None:
        response_id = new_response_id()
        modalities = tuple(overrides.modalities) if overrides and overrides.modalities else self.config.modalities
        kind = "audio" if "audio" in modalities else "text"
        item = ConversationItem(item_id_for_response(response_id), "assistant", kind, text="", status="in_progress",
                                response_id=response_id, turn_id=self.turn_id)
        rate_in, rate_out = self.capabilities.output_sample_rate, self.config.output_sample_rate
        response = ActiveResponse(response_id, item, modalities, overrides, self.continuous,
                                  StreamResampler(rate_in, rate_out) if rate_in != rate_out else None)
        previous = self.conversation.add(item)
        self.active = response
        metadata = dict(overrides.metadata) if overrides and overrides.metadata else {}
        response.announced = self._emit(ev.ResponseCreated(session_id=self.session_id, response_id=response_id,
                                                           modalities=modalities, metadata=metadata))
        self._emit(ev.ItemAdded(session_id=self.session_id, item=item.snapshot(), previous_item_id=previous))
        self._emit(ev.OutputItemAdded(session_id=self.session_id, response_id=response_id, item=item.snapshot()))
        self._emit(ev.ContentPartAdded(session_id=self.session_id, response_id=response_id, item_id=item.id,
                                       kind=kind))
        self._maybe_start_engine_response()

    def _maybe_start_engine_response(self) -> None:
        response = self.active
        if response is None or response.engine_started or response.continuous or self._awaiting_transcripts:
            return
        response.engine_started = True
        o = response.overrides
        instructions = o.instructions if o and o.instructions is not None else self.config.instructions
        messages = [ChatMessage("system", instructions)] if instructions else []
        messages.extend(self.conversation.history())
        max_tokens = o.max_output_tokens if o and o.max_output_tokens else self.config.max_output_tokens
        params = SamplingParams(
            temperature=o.temperature if o and o.temperature is not None else self.config.temperature,
            **({} if max_tokens == "inf" else {"max_tokens": int(max_tokens)}))
        self.engine.respond(ResponseRequest(
            response_id=response.id, epoch=self.epoch, messages=tuple(messages),
            voice=(o.voice if o and o.voice else None) or self.config.voice,
            # An audio answer's text is its transcript, carried by the audio chunks: asking for
            # "text" as well would make an engine stream the same words twice.
            modalities=("audio",) if response.audio else ("text",), params=params))

    def _advance_epoch(self, *, clear_output: bool) -> None:
        """New fence: queued and held audio of the old epoch is dropped before the engine
        is told, so nothing of the old epoch can be delivered afterwards."""
        old = self.epoch
        self.epoch += 1
        cleared = []
        if clear_output:
            for response_id in self._audible:
                if self.outlet.buffer.invalidate(response_id, old) or response_id == self.active_response_id:
                    cleared.append(response_id)
            self._audible.clear()
        self.engine.set_epoch(self.epoch)
        for response_id in cleared:
            self._emit(ev.OutputAudioCleared(session_id=self.session_id, response_id=response_id))

    def _barge_in(self, reason: str) -> None:
        self._advance_epoch(clear_output=True)
        if self.active is not None and not self.continuous:
            self._end_response("cancelled", {"type": "cancelled", "reason": "barge_in", "source": reason})

    def _end_response(self, status: Outcome, details: dict[str, Any] | None = None,
                      usage: dict[str, int] | None = None) -> None:
        """The completion batch: audio/text done markers, part/item done, ``response.done``,
        ``rate_limits.updated``. Stops early if the batch overflows the buffer."""
        response = self.active
        assert response is not None
        item = response.item
        if response.resampler is not None and status == "completed":
            tail = response.resampler.flush()
            if tail.size:
                self._emit_audio(response, tail, None, resample=False)
        item.settle(status, self.config.playback_commit_policy)
        if status == "failed":
            self.conversation.remove(item.id)
        ids = {"session_id": self.session_id, "response_id": response.id, "item_id": item.id}
        text = item.text or ""
        batch: list[ev.SessionEvent] = (
            [ev.AudioDone(**ids), ev.TranscriptDone(**ids, transcript=text)] if response.audio
            else [ev.TextDone(**ids, text=text)])
        snapshot = item.snapshot()
        batch += [ev.ContentPartDone(**ids, kind=item.kind, text=text),
                  ev.OutputItemDone(session_id=self.session_id, response_id=response.id, item=snapshot),
                  ev.ItemDone(session_id=self.session_id, item=snapshot)]
        for event in batch:
            if not self._emit(event):
                return
        done = ev.ResponseDone(session_id=self.session_id, response_id=response.id, status=status,
                               status_details=details, output=(snapshot,), usage=usage,
                               committed=status != "failed" and bool(item.committed_text))
        if not self._emit(done):
            return
        response.ending_queued = True
        self.active = None
        self._emit(ev.RateLimitsUpdated(session_id=self.session_id))
        if self._deferred_response and not self.output_failed and self._stop is None:
            self._deferred_response = False
            self._begin_response(None)

    def _emit_audio(self, response: ActiveResponse, pcm: Any, text: str | None, *, resample: bool = True) -> None:
        item = response.item
        engine_rate, rate = self.capabilities.output_sample_rate, self.config.output_sample_rate
        if resample and (response.resampler.out_rate if response.resampler else engine_rate) != rate:
            # session.update changed the output rate mid-response (the eternal lockstep one too).
            response.resampler = StreamResampler(engine_rate, rate) if engine_rate != rate else None
        if resample and response.resampler is not None:
            pcm = response.resampler.process(pcm)
        ids = {"session_id": self.session_id, "response_id": response.id, "item_id": item.id}
        if pcm.size:
            if not self._emit(ev.AudioDelta(**ids, pcm=pcm, sample_rate=self.config.output_sample_rate,
                                            audio_format=self.config.output_audio_format)):
                return
            item.audio_ms += 1000.0 * pcm.size / self.config.output_sample_rate
            if not self._audible or self._audible[-1] != response.id:
                self._audible.append(response.id)
        if text or not response.continuous:
            item.text = (item.text or "") + (text or "")
            self._emit(ev.TranscriptDelta(**ids, delta=text or ""))

    def _emit_text(self, response: ActiveResponse, text: str) -> None:
        item = response.item
        item.text = (item.text or "") + text
        ids = {"session_id": self.session_id, "response_id": response.id, "item_id": item.id}
        if response.audio:
            self._emit(ev.TranscriptDelta(**ids, delta=text))
        else:
            self._emit(ev.TextDelta(**ids, delta=text))

    def _current_for(self, epoch: int, response_id: str | None) -> ActiveResponse | None:
        """The response an engine output belongs to, or None when it is stale."""
        if epoch != self.epoch or self.output_failed:
            return None
        if self.continuous:
            if self.active is None and self._stop is None:
                self._begin_response(None)
            return self.active
        active = self.active
        return active if active is not None and active.id == response_id else None
