"""One conversation on the cascade engine (the ``EngineSession``).

Input side: ``push_audio`` (the engine's input rate) only queues; one input task per session
feeds the streaming STT where one hears (at that rate), resamples to the VAD's 16 kHz, runs the VAD
on the shared VAD thread, feeds the ``TurnDetector`` (server VAD) or the ``ManualTurn``
(``turn_detection: null``), emits ``SpeechStarted``/``SpeechStopped``, re-decodes the
growing utterance for partial ``InputTranscript``s (the text the hypothesis grew by since the
last one sent; a revised hypothesis sends nothing, the final settles it), and, the moment
VAD ends a turn, starts that turn's
final decode so ``commit_input`` usually finds it done. A pause long enough is transcribed
at once; that transcript is the final when the turn ends in the pause, and it starts a
preemptive reply, kept unheard until ``respond`` asks for exactly it (``preemption``).

Output side: ``respond`` runs the reply chain (LLM -> sentences -> TTS) and emits
``OutputText`` (token deltas, when text is a requested modality), ``OutputAudio`` at
24 kHz in 40 ms chunks (the first chunk of each sentence carries that sentence's text),
then ``ResponseFinished`` with token usage. A request with ``speak`` text skips the LLM:
the text goes through the same sentence splitter and TTS. ``set_epoch`` fences: queued reply output of
older epochs is purged, the running reply is cancelled (LLM request dropped, TTS jobs not
yet started skipped) and no older-epoch event is emitted after it returns — not even that
reply's ``ResponseFinished`` (the session core, which cancelled it, reports it).

The engine never decides when to respond or keeps history: the session core does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.codecs.resample import StreamResampler
from rtserve.config import CascadeLimits, SemanticVadThresholds
from rtserve.engines.audio_pace import AudioPace
from rtserve.engines.cascade.asr import WhisperAsr
from rtserve.engines.cascade.audio import as_pcm
from rtserve.engines.cascade.events import EventChannel
from rtserve.engines.cascade.instructions import DEFAULT_INSTRUCTIONS
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.preemption import BufferedRun, Preemption, ReplyPlan
from rtserve.engines.cascade.reply import ReplyChain, SpokenChunk
from rtserve.engines.cascade.stream_asr import StreamAsr
from rtserve.engines.cascade.turn_clock import TurnClock
from rtserve.engines.cascade.turn_detection import ManualTurn, SealedTurn, TurnDetector
from rtserve.engines.cascade.vad import VadEngine, VadScores, VadStream
from rtserve.engines.errors import EngineError
from rtserve.engines.events import (
    EngineEvent,
    EngineFailure,
    InputTranscript,
    OutputAudio,
    OutputText,
    OutputToolCall,
    ResponseFinished,
    SpeechStarted,
    transcript_growth,
)
from rtserve.engines.pipeline import StageFailed
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import (
    ChatMessage,
    EngineCapabilities,
    Pcm,
    ResponseRequest,
    SamplingParams,
    SessionOptions,
    TokenDelta,
)
from rtserve.errors import ENGINE_ERROR

log = logging.getLogger(__name__)


# The rubric of benchmarks/bench_answer_quality.py --compare (README, "Voice agent quality"): SmolLM2-135M
# answers more questions right when asked to answer directly and correctly than when told to be friendly.
@dataclass(frozen=True)
class CascadeModels:
    """The models one engine's sessions share. ``asr`` is None where sessions hear with a
    streaming STT (each opens its own stream: ``hearing``); the TTS is the reply chain's."""

    vad: VadEngine
    asr: WhisperAsr | None
    reply: ReplyChain


_Backlog = FloatArray | int | asyncio.Future[None]  # audio, a gap of dropped samples, or a drain marker


class CascadeSession:
    def __init__(
        self,
        session_id: str,
        capabilities: EngineCapabilities,
        models: CascadeModels,
        options: SessionOptions,
        limits: CascadeLimits,
        max_pending_turns: int,
        metrics: CascadeMetrics,
        on_close: Callable[[CascadeSession], None],
        hearing: Callable[[Callable[[EngineEvent], None]], StreamAsr] | None = None,
    ) -> None:
        """``hearing``: opens the session's streaming STT (``cascade.asr: stt_engine``), given where
        it reports; None: Whisper (``models.asr``) transcribes each turn."""
        if hearing is None and models.asr is None:
            raise ValueError("a cascade session needs Whisper or a streaming STT to hear with")
        self.session_id = session_id
        self.capabilities = capabilities
        self._models = models
        self._options = options
        self._metrics = metrics
        self._clock = TurnClock(metrics.turn_seconds, options.route)
        self._on_close = on_close
        rate = capabilities.input_sample_rate
        # Turn audio and the VAD's timeline are at the VAD's rate (Whisper's too).
        self._to_turn_rate = StreamResampler(rate, models.vad.sample_rate)
        self._max_turn_samples = int(limits.max_turn_audio_s * models.vad.sample_rate)
        self._max_backlog = limits.max_input_backlog_ms * rate // 1000
        self._max_pending_turns = max_pending_turns
        self._turn: TurnDetector | ManualTurn = self._new_turn(options.server_vad)
        self._vad_stream = VadStream()
        self._backlog: deque[_Backlog] = deque()
        self._backlog_samples = 0
        self._input_ready = asyncio.Event()
        self._input_generation = 0  # bumped by clear_input: results of older VAD calls are void
        self._partial: asyncio.Task[None] | None = None
        self._partial_at = 0  # turn length (samples) of the latest partial decode
        self._last_partial = ""
        self._sealed: deque[tuple[int, asyncio.Future[str]]] = deque()
        self._commit_lock = asyncio.Lock()
        self._channel = EventChannel(limits.output_queue_ms * capabilities.output_sample_rate // 1000)
        self._max_audio_ahead_s = limits.max_audio_ahead_s
        self._stream_asr = hearing(self._channel.put_control) if hearing is not None else None
        self._semantic: SemanticVadThresholds = limits.semantic_vad
        self._epoch = 0
        self._response: asyncio.Task[None] | None = None
        self._response_meta: tuple[str, int] | None = None  # (response_id, epoch) of the running reply
        self._closed = False
        first_plan = ReplyPlan(
            self._with_instructions(()),
            options.sampling or SamplingParams(),
            options.prompt.voice,
            speak=True,
            route=options.route,
        )
        self._preemption = Preemption(
            models.asr, models.reply, limits, first_plan, metrics.preemptive_replies, _consume_outcome
        )
        self._input_task = asyncio.create_task(self._input_loop(), name=f"cascade-input:{session_id}")

    # -- configuration -------------------------------------------------------------------

    def _new_turn(self, settings: TurnDetection | None) -> TurnDetector | ManualTurn:
        if settings is None:
            return ManualTurn(self._max_turn_samples)
        vad = self._models.vad
        return TurnDetector(settings, vad.sample_rate, vad.window, self._max_turn_samples)

    def configure_turn_detection(self, settings: TurnDetection | None) -> None:
        """Apply new turn detection settings (``session.update``); the current,
        uncommitted turn is dropped."""
        turn = self._new_turn(settings)
        self.clear_input()
        self._turn = turn

    # -- input ---------------------------------------------------------------------------

    def push_audio(self, pcm: Pcm) -> None:
        if self._closed:
            return
        audio = as_pcm(pcm)
        if not len(audio):
            return
        self._backlog.append(audio)
        self._backlog_samples += len(audio)
        while self._backlog_samples > self._max_backlog:
            self._drop_oldest_input()
        self._input_ready.set()

    def _drop_oldest_input(self) -> None:
        for index, item in enumerate(self._backlog):
            if isinstance(item, np.ndarray):
                self._backlog[index] = len(item)  # keeps the VAD timeline aligned with the client's
                self._backlog_samples -= len(item)
                self._metrics.dropped_input_samples.inc(len(item))
                return

    async def _input_loop(self) -> None:
        while True:
            await self._input_ready.wait()
            self._input_ready.clear()
            while self._backlog:
                item = self._backlog.popleft()
                if isinstance(item, asyncio.Future):
                    if not item.done():
                        item.set_result(None)
                elif isinstance(item, int):  # dropped input, at the input rate
                    resampler = self._to_turn_rate
                    self._vad_stream.skip(round(item * resampler.out_rate / resampler.in_rate))
                else:
                    chunks = [item]
                    while self._backlog and isinstance(following := self._backlog[0], np.ndarray):
                        self._backlog.popleft()
                        chunks.append(following)
                    audio = np.concatenate(chunks) if len(chunks) > 1 else item
                    self._backlog_samples -= len(audio)
                    try:
                        await self._analyse(audio)
                    except EngineError as exc:  # e.g. the VAD thread is saturated: lose this audio only
                        log.warning("input audio dropped: %s", exc)
                        self._metrics.dropped_input_samples.inc(len(audio))
                    except Exception:
                        log.exception("input analysis failed")
                        self._channel.put_control(EngineFailure(ENGINE_ERROR, "voice activity detection failed"))

    async def _analyse(self, audio: FloatArray) -> None:
        turn = self._turn
        if self._stream_asr is not None:
            self._stream_asr.push(audio)
        audio = self._to_turn_rate.process(audio)
        if not audio.size:  # the resampler holds it back (its filter's first block)
            return
        if isinstance(turn, ManualTurn):
            turn.append(audio)
        else:
            generation = self._input_generation
            scores = await self._models.vad.process(self._vad_stream, audio)
            if generation != self._input_generation or turn is not self._turn:
                return  # cleared or reconfigured while the VAD ran
            for happened in turn.feed(scores.windows, scores.scores, scores.first_sample):
                if isinstance(happened, SealedTurn):
                    self._seal(happened, self._silence_after(happened, scores))
                else:
                    self._channel.put_control(happened)
                    if isinstance(happened, SpeechStarted):
                        self._clock.speech_started(replying=self._response is not None)
            if turn.speaking and not turn.pausing:
                self._clock.heard_speech()
            if self._stream_asr is None:
                self._preemption.follow(turn)
            else:
                self._end_turn_when_heard(turn)
        self._maybe_partial()

    def _end_turn_when_heard(self, turn: TurnDetector) -> None:
        """``semantic_vad`` on the streaming STT: a pause ends the turn at once when the model's
        end-of-turn head is sure enough for the eagerness (docs/engines.md#cascade-streaming-asr)."""
        assert self._stream_asr is not None
        settings = turn.settings
        if settings.type != "semantic_vad" or not turn.pausing:
            return
        if self._stream_asr.end_of_turn >= getattr(self._semantic, settings.eagerness or "auto"):
            turn.end_pause_after(0)

    def _maybe_partial(self) -> None:
        turn = self._turn
        asr = self._models.asr
        # No partial in a pause: it would add no words and could hold up the final decode.
        if (
            self._stream_asr is not None  # its words are the partials
            or asr is None
            or not turn.speaking
            or turn.pausing
            or (self._partial is not None and not self._partial.done())
            or turn.turn_samples - self._partial_at < asr.partial_interval_samples
            or not asr.idle
        ):
            return
        self._partial_at = turn.turn_samples
        self._partial = asyncio.create_task(self._decode_partial(turn.turn_id, turn.turn_audio()))

    async def _decode_partial(self, turn_id: int, audio: FloatArray) -> None:
        assert self._models.asr is not None  # partials are Whisper's (``_maybe_partial``)
        try:
            text = await self._models.asr.decode(audio, final=False, live_turn=True)
        except EngineError as exc:
            log.debug("partial transcript skipped: %s", exc)
            return
        growth = transcript_growth(self._last_partial, text)
        if turn_id == self._turn.turn_id and growth:
            self._last_partial = text
            self._channel.put_control(InputTranscript(growth, final=False))

    def _silence_after(self, turn: SealedTurn, scores: VadScores) -> float:
        """Seconds of input the VAD scored after ``turn``'s speech ended (0: cut by hand)."""
        if turn.voiced_end is None:
            return 0.0
        vad = self._models.vad
        return (scores.first_sample + len(scores.windows) * vad.window - turn.voiced_end) / vad.sample_rate

    def _seal(self, turn: SealedTurn, trailing_silence_s: float) -> None:
        """VAD ended a turn ``trailing_silence_s`` before the end of the audio analysed: start its
        final transcript now, ahead of the commit that will want it."""
        self._reset_partials()
        if len(self._sealed) >= self._max_pending_turns:
            dropped_id, dropped = self._sealed.popleft()
            dropped.cancel()
            log.warning("turn %d was never committed; dropped (max %d pending)", dropped_id, self._max_pending_turns)
        final: asyncio.Future[str] | None
        if self._stream_asr is not None:  # marked now, where the turn's speech ended
            final = self._stream_asr.finish_turn(trailing_silence_s)
        else:
            final = self._preemption.final_transcript(turn)
        if final is None:
            final = asyncio.create_task(self._final_transcript(turn.audio))
        final.add_done_callback(_consume_outcome)
        self._sealed.append((turn.turn_id, final))
        self._clock.sealed(turn.turn_id)

    def _reset_partials(self) -> None:
        if self._partial is not None:
            self._partial.cancel()
            self._partial = None
        self._partial_at = 0
        self._last_partial = ""

    async def _drain_input(self) -> None:
        """Wait until every sample pushed so far went through the VAD/turn bookkeeping."""
        marker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._backlog.append(marker)
        self._input_ready.set()
        await marker

    async def drain(self) -> None:
        """Turn output is streamed per response: there is no continuous output to drain."""

    async def commit_input(self) -> None:
        async with self._commit_lock:
            await self._drain_input()
            if self._closed:
                return
            committed: int | None = None  # the VAD's turn id; None: a turn without server VAD
            if self._sealed:
                committed, final = self._sealed.popleft()
                try:
                    text = await final
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if self._closed and not (current and current.cancelling()):
                        return  # the session closed under this commit
                    raise
            else:
                sealed = self._turn.take_turn()
                self._reset_partials()
                text = await self._final_transcript(sealed.audio) if len(sealed.audio) else ""
            self._clock.transcribed(committed)
            self._channel.put_control(InputTranscript(text, final=True))

    async def _final_transcript(self, audio: FloatArray) -> str:
        """A turn's transcript: Whisper decodes its audio; a streaming STT has heard it already."""
        if self._stream_asr is not None:
            return await self._stream_asr.finish_turn()
        assert self._models.asr is not None  # the session was given one of the two
        return await self._models.asr.decode(audio, final=True, live_turn=True)

    def clear_input(self) -> None:
        self._input_generation += 1
        for index, item in enumerate(self._backlog):
            if isinstance(item, np.ndarray):
                self._backlog[index] = len(item)
        self._backlog_samples = 0
        self._turn.reset()
        self._reset_partials()
        self._preemption.clear()
        if self._stream_asr is not None:
            self._stream_asr.clear()
        while self._sealed:
            self._sealed.popleft()[1].cancel()

    # -- output --------------------------------------------------------------------------

    def respond(self, request: ResponseRequest) -> None:
        if self._closed or request.epoch < self._epoch:
            return
        if self._response is not None and not self._response.done():
            self._response.cancel()
            if self._response_meta is not None:
                previous_id, previous_epoch = self._response_meta
                self._channel.put_finished(
                    ResponseFinished(previous_id, previous_epoch, "cancelled", reason="superseded by a new response")
                )
        self._response_meta = (request.response_id, request.epoch)
        speak = "audio" in request.modalities
        plan = ReplyPlan(
            self._with_instructions(request.messages),
            request.params,
            request.voice if speak else None,
            speak,
            self._options.route,
        )
        if request.speak is None:
            run = self._preemption.take(plan)
        else:  # given text to say: no LLM reply, so none started in the pause can stand
            self._preemption.clear()
            run = None
        self._preemption.replying()
        self._response = asyncio.create_task(
            self._reply(request, plan, run), name=f"cascade-reply:{request.response_id}"
        )

    def _with_instructions(self, messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
        if messages and messages[0].role == "system":
            return messages
        instructions = self._options.prompt.text or DEFAULT_INSTRUCTIONS
        return (ChatMessage("system", instructions), *messages)

    async def _reply(self, request: ResponseRequest, plan: ReplyPlan, preempted: BufferedRun | None) -> None:
        """Stream one reply (the preemptive run when it is this one) and report how it ended."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        speech_ended = self._clock.reply_started()
        speak, show_text = plan.speak, "text" in request.modalities
        status: Literal["completed", "cancelled", "failed"] = "completed"
        reason: str | None = None
        usage: dict[str, int] = {}
        first_audio = True
        pace = AudioPace(self._max_audio_ahead_s, self.capabilities.output_sample_rate)
        said: list[str] = []  # what the session core will keep as this answer's text
        called = False
        try:
            if speak:
                self._models.reply.check_request(request.voice)
            if request.speak is not None:
                items = self._models.reply.speak(request.speak, voice=request.voice)
            elif preempted is not None:
                items = preempted.items()
            else:
                items = self._models.reply.run(
                    plan.messages, plan.params, speak=speak, voice=plan.voice, route=plan.route
                )
            async with contextlib.aclosing(items):
                async for item in items:
                    if isinstance(item, SpokenChunk):
                        said.append(item.text or "")
                        await pace.hold(len(item.pcm))
                        await self._channel.put_output(
                            OutputAudio(item.pcm, request.epoch, request.response_id, item.text)
                        )
                        if first_audio:
                            first_audio = False
                            self._metrics.first_audio_seconds.observe(loop.time() - started)
                            self._clock.first_audio(speech_ended)
                        continue
                    delta: TokenDelta = item
                    if delta.text and (show_text or not speak):
                        said.append(delta.text)
                        await self._channel.put_output(OutputText(delta.text, request.epoch, request.response_id))
                    if delta.tool_call is not None:
                        called = True
                        await self._channel.put_output(
                            OutputToolCall(delta.tool_call, request.epoch, request.response_id)
                        )
                    if delta.finish_reason is not None:
                        usage = {
                            "input_tokens": delta.prompt_tokens,
                            "output_tokens": delta.completion_tokens,
                            "total_tokens": delta.prompt_tokens + delta.completion_tokens,
                        }
        except StageFailed as exc:
            status, reason = "failed", _failure_reason(exc.__cause__)
        except EngineError as exc:
            status, reason = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - the response fails with the reason; the session goes on
            status, reason = "failed", _failure_reason(exc)
        if status == "completed" and not called:
            self._preemption.replied(plan, "".join(said))
        await self._channel.put_output(ResponseFinished(request.response_id, request.epoch, status, usage, reason))

    def set_epoch(self, epoch: int) -> None:
        if epoch <= self._epoch:
            return
        self._epoch = epoch
        self._channel.fence(epoch)
        if self._response is not None and self._response_meta is not None and self._response_meta[1] < epoch:
            self._response.cancel()
            self._response = self._response_meta = None
            self._clock.reply_cut()

    async def events(self) -> AsyncGenerator[EngineEvent, None]:
        while (event := await self._channel.get()) is not None:
            yield event

    # -- lifetime ------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._preemption.clear()
        tasks: list[asyncio.Future[Any]] = [self._input_task, *(task for _, task in self._sealed)]
        tasks += [t for t in (self._partial, self._response) if t is not None]
        for task in tasks:
            task.cancel()
        for item in self._backlog:
            if isinstance(item, asyncio.Future) and not item.done():
                item.set_result(None)  # a commit waiting for its drain returns quietly
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._stream_asr is not None:
            await self._stream_asr.close()
        self._channel.close()
        self._on_close(self)


def _consume_outcome(task: asyncio.Future[str]) -> None:
    """A speculative final nobody awaited (cleared, closed) must not log 'never retrieved'."""
    if not task.cancelled():
        task.exception()


def _failure_reason(cause: BaseException | None) -> str:
    if isinstance(cause, EngineError):
        return str(cause)
    log.error("reply failed", exc_info=cause)
    return "internal error while generating the reply"
