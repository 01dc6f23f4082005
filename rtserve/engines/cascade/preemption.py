"""The preemptive reply: a turn's answer started while the turn is still ending (issue 18).

Why: on two CPU cores the end-of-turn wait, the final transcript and the reply's first
clause each take hundreds of milliseconds; one after the other they add up to seconds.
Here they overlap. Once a server-VAD turn has paused for ``cascade.pause_transcript_ms``
its audio so far is transcribed (one final-quality decode, at the final's priority), and
that transcript is

* the turn's final transcript, when the turn ends in this same pause (all audio after it
  is silence: nothing is left to decode, so the final is ready when the turn ends);
* the reason to end the turn early, when it reads as a finished sentence and the client
  left ``silence_duration_ms`` unset (``end_of_turn``; ``cascade.complete_turn_silence_ms``);
* the user message of a reply started at once (``cascade.preemptive_reply``) from the
  ``ReplyPlan`` the session core is expected to send: the previous response's messages,
  the answer this engine gave it, then this transcript, with the previous sampling and
  voice (at first those the session was opened with). It runs into a bounded buffer
  (``BufferedRun``) and nothing of it leaves the engine.

When the session core's ``respond`` asks for exactly that plan, the buffered run is
adopted: its audio, already partly made, streams on under the new response's id and
epoch. Any other request, speech resuming in the pause (the detector's ``pause_key``
changes), a new pause, clearing the input, new turn settings and closing the session
drop it: its audio is never delivered and, since the session core never heard of it,
it leaves no history. Equality of plans, not a guess, decides: a wrong guess costs CPU,
never a wrong answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import Counter

from rtserve.codecs.pcm import FloatArray
from rtserve.config import CascadeLimits
from rtserve.engines.cascade.asr import WhisperAsr
from rtserve.engines.cascade.end_of_turn import reads_complete
from rtserve.engines.cascade.reply import ReplyChain, SpokenChunk
from rtserve.engines.cascade.turn_detection import SealedTurn, TurnDetector
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta

log = logging.getLogger(__name__)

ReplyItem = TokenDelta | SpokenChunk


@dataclass(frozen=True)
class ReplyPlan:
    """Everything a reply is generated from: equal plans give the same reply stream."""

    messages: tuple[ChatMessage, ...]  # instructions first
    params: SamplingParams
    voice: str | None  # None when not spoken
    speak: bool
    route: str = ""  # the session's route, labelling its stage metrics

    def answering(self, user_text: str) -> ReplyPlan:
        return replace(self, messages=(*self.messages, ChatMessage("user", user_text)))

    def answered(self, assistant_text: str) -> ReplyPlan:
        """The plan's conversation once its answer is in history (as the session core keeps it)."""
        if not assistant_text:
            return self
        return replace(self, messages=(*self.messages, ChatMessage("assistant", assistant_text)))


class _End:
    pass


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_END = _End()


class BufferedRun:
    """A reply run read ahead by its own task into a queue of ``max_items``; then it waits."""

    def __init__(self, items: AsyncGenerator[ReplyItem, None], max_items: int) -> None:
        self._queue: asyncio.Queue[ReplyItem | _End | _Failed] = asyncio.Queue(max_items)
        self._task = asyncio.create_task(self._pump(items), name="cascade-preemptive-reply")

    async def _pump(self, items: AsyncGenerator[ReplyItem, None]) -> None:
        try:
            async with contextlib.aclosing(items):
                async for item in items:
                    await self._queue.put(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to whoever adopts the run
            await self._queue.put(_Failed(exc))
            return
        await self._queue.put(_END)

    async def items(self) -> AsyncGenerator[ReplyItem, None]:
        """The run's items from the first; raises what the run raised."""
        try:
            while not isinstance(item := await self._queue.get(), _End):
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._task.cancel()


@dataclass(eq=False)
class _Pause:
    key: tuple[int, int]  # the turn detector's ``pause_key``
    transcript: asyncio.Task[str] | None = None
    plan: ReplyPlan | None = None
    reply: BufferedRun | None = None
    sealed: bool = False  # the turn ended in this pause: ``transcript`` is its final


class Preemption:
    """One session's pause transcript and preemptive reply (at most one of each)."""

    def __init__(
        self,
        asr: WhisperAsr | None,
        chain: ReplyChain,
        limits: CascadeLimits,
        first_plan: ReplyPlan,
        outcomes: Counter,
        consume: Callable[[asyncio.Task[Any]], None],
    ) -> None:
        """``asr``: None where the session hears with a streaming STT, which needs no pause
        transcript (the session then never calls ``follow`` or ``final_transcript``)."""
        self._asr = asr
        self._chain = chain
        self._limits = limits
        self._base: ReplyPlan | None = first_plan  # the conversation before the next user turn
        self._outcomes = outcomes
        self._consume = consume
        self._pause: _Pause | None = None

    # -- the conversation the next request is expected to carry -----------------------------

    def replying(self) -> None:
        """A reply started: what the conversation will hold is unknown until it completes."""
        self._base = None

    def replied(self, plan: ReplyPlan, assistant_text: str) -> None:
        """A reply completed with ``assistant_text`` (what the session core puts in history)."""
        self._base = plan.answered(assistant_text)

    # -- input side ------------------------------------------------------------------------

    def follow(self, turn: TurnDetector) -> None:
        """After each VAD step: drop a pause that speech ended, start one that is long enough."""
        pause = self._pause
        if pause is not None and not pause.sealed and pause.key != turn.pause_key:
            self._drop()  # the user went on speaking
        limit = self._limits.pause_transcript_ms
        if (
            not limit
            or not turn.pausing
            or turn.pause_ms < limit
            or (self._pause is not None and self._pause.key == turn.pause_key)
        ):
            return
        self._drop()
        pause = self._pause = _Pause(turn.pause_key)
        pause.transcript = asyncio.create_task(self._transcribe(pause, turn, turn.turn_audio()))
        pause.transcript.add_done_callback(self._consume)

    async def _transcribe(self, pause: _Pause, turn: TurnDetector, audio: FloatArray) -> str:
        assert self._asr is not None
        text = await self._asr.decode(audio, final=True, live_turn=True)
        if self._pause is not pause or not text:
            return text
        settings = turn.settings
        if self._limits.preemptive_reply and settings.create_response and self._base is not None:
            pause.plan = self._base.answering(text)
            items = self._chain.run(
                pause.plan.messages,
                pause.plan.params,
                speak=pause.plan.speak,
                voice=pause.plan.voice,
                route=pause.plan.route,
            )
            pause.reply = BufferedRun(items, self._limits.preemptive_buffer_chunks)
            self._outcomes.labels("started").inc()
        if (
            not pause.sealed
            and turn.pause_key == pause.key
            and self._limits.complete_turn_silence_ms
            and settings.type == "server_vad"
            and "silence_duration_ms" not in settings.model_fields_set
            and reads_complete(text)
        ):
            turn.end_pause_after(self._limits.complete_turn_silence_ms)
        return text

    def final_transcript(self, sealed: SealedTurn) -> asyncio.Task[str] | None:
        """The turn ended: its final transcript when the pause it ended in was transcribed."""
        pause = self._pause
        if pause is None or pause.key != sealed.pause_key or pause.transcript is None:
            self._drop()
            return None
        pause.sealed = True
        return pause.transcript

    def clear(self) -> None:
        """The input was cleared, reconfigured or closed: nothing of the pause stands."""
        self._drop()

    def _drop(self) -> None:
        pause, self._pause = self._pause, None
        if pause is None:
            return
        if pause.transcript is not None and not pause.sealed:
            pause.transcript.cancel()  # a sealed one belongs to the commit that awaits it
        if pause.reply is not None:
            pause.reply.cancel()
            self._outcomes.labels("dropped").inc()

    # -- output side -----------------------------------------------------------------------

    def take(self, plan: ReplyPlan) -> BufferedRun | None:
        """The preemptive reply when it is exactly ``plan``; any other is dropped."""
        pause = self._pause
        if pause is None or pause.reply is None:
            return None
        if pause.plan != plan:
            log.debug("preemptive reply does not match the request; dropped")
            self._pause = None if pause.sealed else pause
            pause.reply.cancel()
            pause.reply = pause.plan = None
            self._outcomes.labels("dropped").inc()
            return None
        run, pause.reply, pause.plan = pause.reply, None, None
        if pause.sealed:
            self._pause = None
        self._outcomes.labels("adopted").inc()
        return run
