"""``TTSFrameModel``: ``KyutaiTTSModel`` as a lockstep ``FrameModel`` that takes text, not audio
(docs/engines.md#kyutai-tts-on-the-lockstep-runtime).

The lockstep runtime drives it like any frame model: one engine thread, one batched ``step`` per
80 ms tick, per-row reset when a slot opens, the epoch fence at scatter. Two things differ, and
the runtime's one small generalisation covers both rather than a second scheduler loop:

* **Input is text.** The scheduler runs with ``audio_input=False`` (no audio backlog read, no
  underrun counted), and a session's input reaches the model through
  ``LockstepScheduler.between_steps``: calls queued with the slot's other control operations and
  applied on the engine thread between steps, skipped once the session no longer holds the slot.
  A session's first call is ``begin`` (its voice and seed: the row is reset then, since the voice
  is only known once resolved), then ``push`` for its words and ``end`` for end of stream.
* **Stepping is data-driven**, as in Kyutai's server: a row steps only when it holds the next
  word and its lookahead (or the text is complete). A tick where no row may step runs no model
  at all; rows that wait get no output that tick (``None``), so every output is one step.
  Audio may be made ahead of playback, so the scheduler runs it ahead of its ticks while a
  ready row's reader has room (``ready_rows``), and holds back a row whose reader does not
  (not ``live`` that step).

* **New replies catch up** (docs/engines.md#pre-audio-steps). A row that makes no audio yet
  (``young_rows``: its audio delay) steps in the model's pre-audio step, about a third of a
  full one. A step where only young rows would step is a pre-audio step. When older rows would
  step too, the young rows go alone in a pre-audio step as long as every such older row has at
  least ``catch_up_lead_s`` of audio made ahead of its playback (counted from its first audio
  frame at real time); otherwise, or while an older row is about to make its first audio, a
  full step of everyone (the young rows included). A reply then reaches its first audio sooner
  than stepping with the whole batch, and no older stream's playback runs dry for it. Those full
  steps come at most once per ``full_step_cadence_s`` unless an older row is down to half its
  lead, so several replies' first audio and the others' lead share one.
* **The young batch** (``young``, docs/engines.md#young-batch): a new reply starts in a small
  pre-audio-only model on the same weights, whose step costs a fraction of the main batch's
  pre-audio step (a few rows, a few ring slots). It steps in every call, several steps back
  to back for up to ``young_burst_s`` (on its own CUDA stream; beside the main batch's step,
  until that ends if sooner); once through its audio
  delay the reply moves into the main batch (``adopt``), where its next full step makes its
  first audio: in the same call when its last steps fit in one burst (they go first then, if
  the older streams that would step have a burst of lead to spare). A reply that finds the
  young batch full waits for a row, its text queued here, for up to ``young_wait_s``; past it,
  it starts in the main batch.

Each output carries the decoded frame once the audio delay has passed (empty before) and a
``SpeechStep`` with running totals, so an output frame dropped for a stalled reader loses only
its audio, never a word boundary or the end.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.conditioning import Voice
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, StepOutputs, TTSFrame, outputs_copy
from rtserve.engines.kyutai_tts.script import Word
from rtserve.engines.values import FrameOutput, SlotPrompt, SpeechStep
from rtserve.errors import INPUT_BACKPRESSURE

_NO_AUDIO = np.zeros(0, np.float32)
# What each step was: the young batch's, the main batch's young rows alone (pre-audio), or the whole
# main batch and why (``_full_step_reason``).
STEP_KINDS = (
    "young_batch",
    "pre_audio",
    "full_no_young",
    "full_no_catch_up",
    "full_first_audio_due",
    "full_lead_short",
)


@dataclass
class _Waiting:
    """A reply waiting for a row of the young batch: what it opens with, and its text so far."""

    since: float  # the clock when it began
    voice: Voice | None
    seed: int | None
    words: list[Word] = field(default_factory=list)
    ended: bool = False


_STEP_TIME_WEIGHT = 0.25  # of the latest burst in the moving mean of a young step's time


def _finished(device: torch.device) -> Callable[[], bool]:
    """Whether the work queued so far on ``device``'s current stream has finished (on a CPU, a
    step has once launched)."""
    if device.type != "cuda":
        return lambda: True
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    event.record()
    return event.query


class TTSFrameModel:
    def __init__(
        self,
        model: KyutaiTTSModel,
        *,
        young: KyutaiTTSModel | None = None,
        catch_up_lead_s: float = 0.0,
        full_step_cadence_s: float = 0.0,
        young_burst_s: float = 0.0,
        young_queue: int = 1,
        young_wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        on_step: Callable[[str], None] | None = None,
        on_first_audio_after_text: Callable[[float], None] | None = None,
        on_young_batch_full: Callable[[], None] | None = None,
        on_seated: Callable[[float, bool], None] | None = None,
    ) -> None:
        """``catch_up_lead_s``: the audio an older row must have ahead of its playback for the
        young rows to step without it (0: never without it). Only for a model run ahead of
        playback: paced, every row must step every tick. ``full_step_cadence_s``: while young rows
        wait, a full step for an older row short of that lead, or about to make its first audio,
        comes at most this long after the last full step, unless a row is down to half the lead
        (0: at once). ``young``: the young batch (a ``pre_audio_only`` model on the same
        weights); ``young_burst_s``: how long its steps may go on back to back in a call (beside
        a main step, until that ends if sooner; 0: one step); ``young_queue``: how many of those
        steps are launched ahead of the host's read of the first (1: each read before the next
        launch); ``young_wait_s``: how long a reply that finds every young row taken waits for one
        (its text queued here) before it starts in the main batch. ``clock``: the scheduler's seconds.
        ``on_step``: told each step's kind (``STEP_KINDS``) once it is launched, for the engine's metrics.
        ``on_first_audio_after_text``: told, at a reply's first audio frame, the seconds since the
        text it last waited for arrived (``_text_arrived``). ``on_young_batch_full``: told when a
        reply finds every row of the young batch taken. ``on_seated``: told, as a reply with a
        young batch beside takes its row, how long it waited for one and whether it is one of the
        young batch's (else it starts in the main batch)."""
        self.model = model
        self.young = young
        # Slot -> its row in the young batch, and row -> its slot (-1: none).
        self._young_row = np.full(model.batch_size, -1, np.int64)
        self._young_slot = np.full(0 if young is None else young.batch_size, -1, np.int64)
        self._young_stream: torch.cuda.Stream | None = None
        if young is not None and young.device.type == "cuda":
            # Of higher priority than the main batch's: the GPU schedules a young step's few small
            # kernels as soon as a full step's kernels leave room, not after that whole step.
            self._young_stream = torch.cuda.Stream(young.device, priority=-1)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.catch_up_lead_s = catch_up_lead_s
        self.full_step_cadence_s = full_step_cadence_s
        self.young_burst_s = young_burst_s
        self.young_queue = young_queue
        # A young step's seconds in the bursts that ran alone (moving mean): what a finishing burst's
        # steps cost. Beside a main step one takes several times as long (the GPU is shared).
        self._young_step_s = 0.0
        self.young_wait_s = young_wait_s
        self._waiting: dict[int, _Waiting] = {}  # slot -> its reply waiting for a young row, oldest first
        self._last_full = -np.inf  # clock time of the last full step
        self._clock = clock
        self._frame_s = model.frame_size / model.sample_rate
        # Per row: when its first audio frame was made (nan: none yet), and how many since.
        self._audio_start = np.full(model.batch_size, np.nan)
        self._audio_frames = np.zeros(model.batch_size, np.int64)
        self.batch_size = model.batch_size
        self.frame_size = model.frame_size
        self.sample_rate = model.sample_rate
        self.output_delay_frames = 0  # no audio input to answer
        self.max_words = model.settings.max_words
        self._words = [0] * model.batch_size
        self._overflow = [False] * model.batch_size
        self._full_steps = np.zeros(model.batch_size, np.int64)
        self._on_step = on_step
        # Per row before its first audio: found waiting for text, and when the text that last let
        # it go on arrived (nan: none yet).
        self._before_audio = np.zeros(model.batch_size, bool)
        self._text_wait = np.zeros(model.batch_size, bool)
        self._text_at = np.full(model.batch_size, np.nan)
        self._on_first_audio_after_text = on_first_audio_after_text
        self._on_young_batch_full = on_young_batch_full
        self._on_seated = on_seated

    # -- scheduler control operations ------------------------------------------------

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        """Nothing steps until the session's ``begin``; live at once (no prefill)."""
        self.release(slot)
        return 0

    def prefill_step(self, slot: int) -> bool:
        return True

    def release(self, slot: int) -> None:
        self._before_audio[slot] = False
        self._waiting.pop(slot, None)
        self.model.release(slot)
        row = self._young_row[slot]
        if row >= 0 and self.young is not None:
            self.young.release(int(row))
            self._young_row[slot], self._young_slot[row] = -1, -1
            self._seat_waiting()

    def _seat_waiting(self) -> None:
        """Replies waiting for a row of the young batch take the rows free now, oldest first; one
        that has waited ``young_wait_s`` starts in the main batch instead. Its text so far goes in."""
        now = self._clock()
        for slot, waiting in list(self._waiting.items()):
            free = np.flatnonzero(self._young_slot < 0)
            if free.size and self.young is not None:
                model, row = self.young, int(free[0])
                self._young_row[slot], self._young_slot[row] = row, slot
            elif now - waiting.since >= self.young_wait_s:
                model, row = self.model, slot
            else:
                continue
            del self._waiting[slot]
            if self._on_seated is not None:
                self._on_seated(now - waiting.since, model is self.young)
            model.open_slot(row, waiting.voice, waiting.seed)
            for word in waiting.words:
                model.push_word(row, list(word.tokens), word.padding)
            if waiting.ended:
                model.end_of_stream(row)

    # -- a session's input (engine thread, between steps) ---------------------------

    def begin(self, slot: int, voice: Voice | None, seed: int | None) -> None:
        self.release(slot)
        if self.young is None:
            self.model.open_slot(slot, voice, seed)
        else:
            self._waiting[slot] = _Waiting(self._clock(), voice, seed)
            self._seat_waiting()
            if self._young_row[slot] < 0 and self._on_young_batch_full is not None:
                self._on_young_batch_full()
        self._words[slot] = 0
        self._overflow[slot] = False
        self._audio_start[slot] = np.nan
        self._audio_frames[slot] = 0
        self._full_steps[slot] = 0
        self._before_audio[slot] = self._text_wait[slot] = True
        self._text_at[slot] = np.nan

    def push(self, slot: int, words: list[Word]) -> None:
        """Queue words; the session keeps at most ``max_words`` unspoken here (past it: refused)."""
        self._text_arrived(slot)
        waiting = self._waiting.get(slot)
        if waiting is not None:
            for word in words:
                if not self.model.machine.takes(len(waiting.words), list(word.tokens)):
                    raise EngineError("too many words wait to be spoken", code=INPUT_BACKPRESSURE)
                waiting.words.append(word)
            return
        model, row = self._holder(slot)
        for word in words:
            try:
                model.push_word(row, list(word.tokens), word.padding)
            except ValueError:
                raise EngineError("too many words wait to be spoken", code=INPUT_BACKPRESSURE) from None

    def end(self, slot: int) -> None:
        self._text_arrived(slot)
        if slot in self._waiting:
            self._waiting[slot].ended = True
            return
        model, row = self._holder(slot)
        model.end_of_stream(row)

    def _text_arrived(self, slot: int) -> None:
        """Text (words or the end) for ``slot``: if its row was found waiting for text before its
        first audio, this may be what lets it go on. The last such arrival before the first audio
        is the text the reply waited for longest; what follows it is the engine's own share."""
        if self._text_wait[slot]:
            self._text_wait[slot] = False
            self._text_at[slot] = self._clock()

    def _holder(self, slot: int) -> tuple[KyutaiTTSModel, int]:
        """The model stepping ``slot``'s stream and its row there."""
        row = int(self._young_row[slot])
        if row >= 0 and self.young is not None:
            return self.young, row
        return self.model, slot

    # -- the batched step ------------------------------------------------------------

    def ready_rows(self) -> npt.NDArray[np.bool_]:
        """Rows that would step now: open and holding the text they need (``RunsAhead``). Replies
        waiting for a row of the young batch take one first, if they can."""
        if self._waiting:
            self._seat_waiting()
        ready = self.model.ready()
        if self.young is not None and (self._young_slot >= 0).any():
            young_ready = self.young.ready() & (self._young_slot >= 0)
            ready[self._young_slot[young_ready]] = True
        self._text_wait |= self._before_audio & ~ready
        return ready

    @torch.no_grad()
    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        """``frames`` carries no input (``audio_input=False``); only ready rows marked ``live`` step
        (a row the scheduler holds back is not live) and only rows that stepped answer."""
        model = self.model
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        stepping = self.ready_rows() & live
        if not stepping.any():
            return outputs
        now = self._clock()
        in_young = self._young_row >= 0
        young_batch = stepping & in_young
        finishing = self._finishing_steps(young_batch, stepping & ~in_young, now)
        if finishing:
            # A reply can be through its delay in this burst: its steps go first, so the main
            # step below makes its first audio this call rather than the next.
            self._young_after_uploads()
            self._step_young_batch(young_batch, outputs, now, None, max_steps=finishing)
            self._adopt_through_delay()
            stepping = self.ready_rows() & live  # the adopted rows' first audio is due
            in_young = self._young_row >= 0
            young_batch = stepping & in_young  # the others step on beside the main step, as ever
        stepping &= ~in_young
        young = stepping & model.young_rows()
        in_young_batch, young_in_main = bool(young_batch.any()), bool(young.any())
        waiting = in_young_batch or young_in_main
        kind = "full_no_young" if not waiting else self._full_step_reason(stepping & ~young, now, young_in_main)
        active = young if kind == "pre_audio" else stepping
        if in_young_batch:
            self._young_after_uploads()  # not after the main step: the young steps run beside it
        launched, main_done = None, None
        if active.any():
            speak = kind != "pre_audio"
            if speak:
                self._full_steps[active] += 1
                self._last_full = now
            launched = model.launch(active, speak=speak)
            if self._on_step is not None:
                self._on_step(kind)
            main_done = _finished(model.device)
        if in_young_batch:
            self._step_young_batch(young_batch, outputs, now, main_done)
        if launched is not None:
            for slot, frame in enumerate(model.read(launched)):
                if frame is not None and frame.stepped and live[slot]:
                    outputs[slot] = self._output(slot, frame, int(model.steps[slot]), now, outputs[slot])
        if in_young_batch:
            self._adopt_through_delay()
        return outputs

    def _young_after_uploads(self) -> None:
        """The young batch's next steps come after the work queued so far on the current stream
        (the words uploaded by ``ready_rows``, the rows adopted)."""
        if self._young_stream is not None:
            self._young_stream.wait_stream(torch.cuda.current_stream(self.model.device))

    def _finishing_steps(self, slots: npt.NDArray[np.bool_], older: npt.NDArray[np.bool_], now: float) -> int:
        """The steps the young batch's rows of ``slots`` that can be through their audio delay
        within one burst still need (the most of theirs; 0: none can, or the ``older`` rows that
        would step cannot wait a burst). A burst's steps are counted from the time a step took in
        the last bursts that ran alone, as this one will (``young_burst_s`` over it; one step a call
        when bursts are off)."""
        young = self.young
        if young is None or not slots.any():
            return 0
        left = young.young_steps - young.steps[self._young_row[slots]]
        fit = 1
        if self.young_burst_s > 0:
            step_s = self._young_step_s
            fit = young.young_steps if step_s <= 0 else max(1, int(self.young_burst_s / step_s))
        near = left[left <= fit]
        # The others' leads only matter (and are only worked out) in a call where one could finish.
        if not near.size or self._spare_lead_s(older, now) < self.young_burst_s:
            return 0
        return int(near.max())

    def _step_young_batch(
        self,
        slots: npt.NDArray[np.bool_],
        outputs: list[FrameOutput | None],
        now: float,
        main_done: Callable[[], bool] | None,
        max_steps: int | None = None,
    ) -> None:
        """Steps of the young batch's rows of ``slots``, back to back on its own stream for up to
        ``young_burst_s``, and beside the main batch's step only while it runs (``main_done``: it
        has finished; None: no main step beside, and the burst's time a step sizes finishing
        bursts). Each costs a few milliseconds against a full step's tens at 128 rows,
        so a new reply goes through its audio delay in a few calls rather than one step a call.
        At least one step, at most ``young_steps`` (what a row needs) or ``max_steps``, and none after a step
        where none of its rows stepped (a row can only go on with text, which comes between
        calls). Up to ``young_queue`` steps are launched ahead of the one read, so the GPU goes
        on while the host reads; the steps launched when the burst ends are read too (a step
        without text leaves every row as it was). A slot's frames merge into its one output
        (running totals; ``word_starts``)."""
        young = self.young
        assert young is not None
        mask = np.zeros(young.batch_size, bool)
        mask[self._young_row[slots]] = True
        started = self._clock()
        stream = contextlib.nullcontext() if self._young_stream is None else torch.cuda.stream(self._young_stream)
        queue: deque[StepOutputs] = deque()
        launched, going_on = 0, True
        most = young.young_steps if max_steps is None else max_steps
        while True:
            while going_on and launched < most and len(queue) < self.young_queue:
                with stream:
                    step = young.launch(mask, speak=False, queued=len(queue))
                    queue.append(step if self.young_queue == 1 else outputs_copy(step))
                launched += 1
                if self._on_step is not None:
                    self._on_step("young_batch")
            if not queue:
                if main_done is None:  # alone: the time a finishing burst's steps take
                    step_s = (self._clock() - started) / launched
                    self._young_step_s += _STEP_TIME_WEIGHT * (step_s - self._young_step_s)
                return
            with stream:
                frames = young.read(queue.popleft())  # waits for the young stream alone
            stepped = False
            for row, frame in enumerate(frames):
                slot = int(self._young_slot[row])
                if frame is not None and frame.stepped and slot >= 0:
                    outputs[slot] = self._output(slot, frame, int(young.steps[row]), now, outputs[slot])
                    stepped = True
            # Bounded beside a main step too: the young steps slow the main step they wait for (the
            # GPU is shared), so unbounded a loaded call ran on (docs/engines.md#young-batch).
            more = self._clock() - started < self.young_burst_s and (main_done is None or not main_done())
            going_on = going_on and stepped and more

    def _adopt_through_delay(self) -> None:
        """Young-batch rows through their audio delay move into the main batch (between its steps)."""
        young = self.young
        assert young is not None
        for row in np.flatnonzero((self._young_slot >= 0) & (young.steps >= young.young_steps)):
            slot = int(self._young_slot[row])
            self.model.adopt(slot, young, int(row))
            self._young_row[slot], self._young_slot[row] = -1, -1
        self._seat_waiting()

    def _output(
        self, slot: int, frame: TTSFrame, steps: int, now: float, merged: FrameOutput | None = None
    ) -> FrameOutput:
        """``frame`` as ``slot``'s output, after ``merged`` (its output of an earlier step this call)."""
        self._words[slot] += frame.words_started
        starts = merged.speech.word_starts if merged is not None and merged.speech is not None else ()
        if frame.words_started:
            starts += (steps,)
        self._overflow[slot] = self._overflow[slot] or frame.overflow
        audio = _NO_AUDIO if frame.audio is None else frame.audio.astype(np.float32, copy=False)
        if frame.audio is not None:
            if not self._audio_frames[slot]:
                self._first_audio(slot, now)
            self._audio_frames[slot] += 1
        speech = SpeechStep(
            steps, self._words[slot], frame.done, self._overflow[slot], int(self._full_steps[slot]), starts
        )
        return FrameOutput(audio, speech=speech)

    def _first_audio(self, slot: int, now: float) -> None:
        self._audio_start[slot] = now
        self._before_audio[slot] = False
        text_at = self._text_at[slot]
        if self._on_first_audio_after_text is not None and not np.isnan(text_at):
            self._on_first_audio_after_text(self._clock() - text_at)

    def _leads(self, rows: npt.NDArray[np.bool_], now: float) -> npt.NDArray[np.float64]:
        """The audio each speaking row of ``rows`` has made ahead of its playback (counted from its
        first audio frame at real time); rows with no audio yet are left out."""
        made: npt.NDArray[np.float64] = self._audio_start[rows] + self._audio_frames[rows] * self._frame_s
        return made[~np.isnan(made)] - now

    def _spare_lead_s(self, older: npt.NDArray[np.bool_], now: float) -> float:
        """How long the speaking rows of ``older`` can wait for their next step before one is under
        half the catch-up lead (where a full step is due at once): a burst of young steps ahead of
        their step spends it. Unbounded when none speaks."""
        leads = self._leads(older, now)
        return float(leads.min()) - self.catch_up_lead_s / 2 if leads.size else np.inf

    def _full_step_reason(self, older: npt.NDArray[np.bool_], now: float, shared: bool) -> str:
        """With young rows stepping: ``pre_audio`` (they go alone), or why the rows past their
        audio delay that would step must step now too: catching up is off, one has no audio yet
        (a reply about to start), or one has less than ``catch_up_lead_s`` ahead of its playback.
        Within ``full_step_cadence_s`` of the last full step only a row under half the lead
        forces one, when young rows of the main batch wait (``shared``): a reply's first audio and
        the others' lead then share full steps, which cost each of those a full step. The young
        batch's rows step beside a full step and wait for none."""
        if not older.any():
            return "pre_audio"
        if self.catch_up_lead_s <= 0:
            return "full_no_catch_up"
        lead = self._leads(older, now)
        if bool((lead < self.catch_up_lead_s / 2).any()):
            return "full_lead_short"
        if shared and now - self._last_full < self.full_step_cadence_s:
            return "pre_audio"
        if lead.size < np.count_nonzero(older):  # the others are about to make their first audio
            return "full_first_audio_due"
        return "pre_audio" if bool((lead >= self.catch_up_lead_s).all()) else "full_lead_short"
