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

* **New replies catch up** (docs/engines.md#text-only-steps). A row inside its audio delay
  (``young_rows``) makes only text, so it steps in the model's text-only step, a fraction of a
  full one. A step where only young rows would step is text-only; while older rows wait to
  run ahead, up to ``catch_up_steps`` text-only steps of the young rows go before each full
  step (which steps the young rows too). A reply then reaches its first audio in about a third
  of the time it would take stepping with the whole batch; older rows still get a full step
  every ``catch_up_steps`` + 1 calls, well inside a frame.

Each output carries the decoded frame once the audio delay has passed (empty before) and a
``SpeechStep`` with running totals, so an output frame dropped for a stalled reader loses only
its audio, never a word boundary or the end.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.conditioning import Voice
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel
from rtserve.engines.kyutai_tts.script import Word
from rtserve.engines.values import FrameOutput, SlotPrompt, SpeechStep
from rtserve.errors import INPUT_BACKPRESSURE

_NO_AUDIO = np.zeros(0, np.float32)


class TTSFrameModel:
    def __init__(self, model: KyutaiTTSModel, *, catch_up_steps: int = 0) -> None:
        """``catch_up_steps``: text-only steps of young rows allowed before each full step while
        older rows would step too (0: a text-only step only when no older row would step).
        Only for a model run ahead of playback: paced, every row must step every tick."""
        self.model = model
        self.catch_up_steps = catch_up_steps
        self._text_only_run = 0  # text-only steps since the last full one
        self.batch_size = model.batch_size
        self.frame_size = model.frame_size
        self.sample_rate = model.sample_rate
        self.output_delay_frames = 0  # no audio input to answer
        self.max_words = model.settings.max_words
        self._steps = [0] * model.batch_size
        self._words = [0] * model.batch_size
        self._overflow = [False] * model.batch_size

    # -- scheduler control operations ------------------------------------------------

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        """Nothing steps until the session's ``begin``; live at once (no prefill)."""
        self.model.release(slot)
        return 0

    def prefill_step(self, slot: int) -> bool:
        return True

    def release(self, slot: int) -> None:
        self.model.release(slot)

    # -- a session's input (engine thread, between steps) ---------------------------

    def begin(self, slot: int, voice: Voice | None, seed: int | None) -> None:
        self.model.open_slot(slot, voice, seed)
        self._steps[slot] = self._words[slot] = 0
        self._overflow[slot] = False

    def push(self, slot: int, words: list[Word]) -> None:
        """Queue words; the session keeps at most ``max_words`` unspoken here (past it: refused)."""
        for word in words:
            try:
                self.model.push_word(slot, list(word.tokens), word.padding)
            except ValueError:
                raise EngineError("too many words wait to be spoken", code=INPUT_BACKPRESSURE) from None

    def end(self, slot: int) -> None:
        self.model.end_of_stream(slot)

    # -- the batched step ------------------------------------------------------------

    def ready_rows(self) -> npt.NDArray[np.bool_]:
        """Rows that would step now: open and holding the text they need (``RunsAhead``)."""
        ready: npt.NDArray[np.bool_] = (self.model.open & self.model.machine.ready()).cpu().numpy()
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
        young = stepping & model.young_rows()
        older_wait = bool((stepping & ~young).any())
        speak = not young.any() or (older_wait and self._text_only_run >= self.catch_up_steps)
        self._text_only_run = 0 if speak else self._text_only_run + 1
        active = torch.from_numpy(stepping if speak else young).to(model.device)
        for slot, frame in enumerate(model.step(active, speak=speak)):
            if frame is None or not frame.stepped or not live[slot]:
                continue
            self._steps[slot] += 1
            self._words[slot] += frame.words_started
            self._overflow[slot] = self._overflow[slot] or frame.overflow
            audio = _NO_AUDIO if frame.audio is None else frame.audio.astype(np.float32, copy=False)
            speech = SpeechStep(self._steps[slot], self._words[slot], frame.done, self._overflow[slot])
            outputs[slot] = FrameOutput(audio, speech=speech)
        return outputs
