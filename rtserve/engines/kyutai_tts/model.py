"""``KyutaiTTSModel``: delayed-streams TTS for B sessions, one batched step per 80 ms frame
(docs/engines.md#kyutai-tts).

Per step, for every row that may step (``TextMachine.ready``): embed the row's token column,
add its summed conditions, one temporal step (cross-attending to its voice), sample the text
token, let the state machine turn it into the token fed back (a word's next token, a pad or
the word marker, muxed with the lookahead stream), walk the depformer over the audio
codebooks, then Mimi-decode the frame whose delays have all elapsed. Audio of the first
``audio_delay`` seconds is forced to "no token" (the audio lags its text by that much).

All state is batched tensors with a per-row reset (``open_slot``); a row that does not step
this tick (its client has not sent enough words yet) keeps its state exactly: its temporal
position, random stream and Mimi decoder state are put back, its token ring is not written, so a
seeded stream says the same whenever its words arrive and whatever the other rows do. Before its
first audio such a row tries the step (``tried_steps``): kept unless the model asks for a word it
lacks, which only its sampled text token says (docs/engines.md#tried-steps). With direct
classifier-free guidance (a checkpoint without a ``cfg`` conditioner and ``cfg_coef != 1``)
every row has a twin row conditioned on nothing, and audio logits are
``null + (cond - null) * cfg_coef`` as the reference computes them.

A row's first ``young_steps`` steps come before its first audio: the audio tokens whose delay
has not passed are forced to "no token" and nothing is decoded. For the published checkpoints
(codebook delays 0, 2, 2, ...) that is every audio token for ``delay_steps`` steps, then all but
the first for two more. ``step(speak=False)`` is the pre-audio step: it walks the depformer over
those first ``pre_audio_codebooks`` codebooks only and leaves the decoder out (about a third of
a full step's time, measured in ``benchmarks/bench_kyutai_tts.py``). Only young rows step in
it, and its effect on them, on their sampler draws and on every other row is exactly the full
step's. Running it for new replies between full steps is what brings a reply's first audio
forward (docs/engines.md#pre-audio-steps).

On a GPU the step's device part (``_advance``: everything from the token column to the
decoded frame) replays as a CUDA graph, one per kind of step (``moshi.cuda_graph``): all its
state is updated in place, so only the copy of its outputs to the host is left per tick
(docs/engines.md#one-graph-per-frame).
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.conditioning import MAX_SPEAKERS, Voice
from rtserve.engines.kyutai_tts.loader import LoadedTTS
from rtserve.engines.kyutai_tts.machine import MachineSettings, TextMachine, TokenIds
from rtserve.engines.kyutai_tts.voices import VoiceFolder
from rtserve.engines.moshi.cuda_graph import capture_graphs
from rtserve.engines.moshi.lm import UNGENERATED_TOKEN, ZERO_TOKEN
from rtserve.engines.moshi.row_views import buckets, first_rows
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.errors import INVALID_VALUE

# A launched step's device outputs: flags [8, B], the frame's codes, the decoded audio.
StepOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def outputs_copy(launched: StepOutputs) -> StepOutputs:
    """A launched step's outputs, copied on the current stream: a CUDA graph's outputs are its
    own, overwritten by its next replay, so a step read after another launch needs a copy."""
    flags, frame, audio = launched
    return flags.clone(), frame.clone(), audio.clone()


@dataclass(frozen=True)
class TTSSettings:
    """Generation settings (the reference ``TTSModel``'s, with Kyutai's server defaults)."""

    temperature: float = 0.6  # 0: greedy
    top_k: int = 250
    top_k_text: int = 25
    cfg_coef: float = 1.0  # a CFG-distilled checkpoint takes it as a condition, else direct CFG
    max_padding: int = 8
    initial_padding: int = 2
    final_padding: int = 4
    padding_between: int = 1
    padding_bonus: float = 0.0
    voice_frames: int = 125  # frames per speaker the cross-attention holds (a voice may be shorter)
    max_words: int = 64  # pending words per session
    max_word_tokens: int = 64


@dataclass(frozen=True)
class TTSFrame:
    """What one step made for one open slot."""

    stepped: bool  # False: the slot waited for words
    codes: npt.NDArray[np.int64] | None  # the frame's text token then audio codes, delays undone (once out)
    audio: npt.NDArray[np.float32] | None  # a decoded 24 kHz frame, once the audio delay has passed
    words_started: int  # 1 when a word was popped this step (its timestamps are known one word later)
    done: bool  # the text ran out and the final padding was spoken: the utterance is over
    overflow: bool  # the lookahead queue overflowed: the slot must be closed


class KyutaiTTSModel:
    def __init__(
        self,
        loaded: LoadedTTS,
        batch_size: int,
        *,
        settings: TTSSettings = TTSSettings(),
        voices: VoiceFolder | None = None,
        graph: bool | None = None,
        pre_audio_only: bool = False,
        row_bucket: int = 0,
        span_bucket: int = 0,
        tried_steps: bool = True,
    ) -> None:
        """``graph``: replay the step as a CUDA graph (default: on a CUDA device). The model owns
        the streaming state of ``loaded``'s LM and Mimi (a second model on the same weights
        takes ``loaded.sharing_weights()``). ``pre_audio_only``: the young batch
        (docs/engines.md#young-batch): pre-audio steps only, no Mimi decoder, attention over
        the audio delay's ring slots alone; ``adopt`` moves its rows into a main model.
        ``row_bucket``: a step computes the first rows up to the last open one, rounded up to a
        multiple of this, and attention reads the ring slots up to the furthest position of those
        rows, rounded up to a multiple of ``span_bucket`` (docs/engines.md#row-buckets); 0: every
        row, or the whole ring, always. ``tried_steps``: a row before its first audio that lacks the
        words its next step may pop tries that step, kept unless the model asks for a word
        (docs/engines.md#tried-steps)."""
        self.loaded = loaded
        self.tried_steps = tried_steps
        self.pre_audio_only = pre_audio_only
        self.arch = arch = loaded.arch
        self.config = c = arch.lm
        self.settings = settings
        self.batch_size = batch_size
        self.lm = loaded.lm
        self.mimi = loaded.mimi
        self.tokenizer = loaded.tokenizer
        self.sample_rate = loaded.mimi_config.sample_rate
        self.frame_size = loaded.mimi_config.frame_size
        self.frame_rate = loaded.mimi_config.frame_rate
        self.codebooks = loaded.mimi.codebooks
        self.delay_steps = int(arch.audio_delay_s * self.frame_rate)
        # The leading codebooks of the smallest delay (when others lag them) are the only ones a
        # row makes before its first audio; ``young_steps`` are the steps before the others start.
        audio_delays = c.delays[1 : 1 + self.codebooks]
        leading = next((k for k, d in enumerate(audio_delays) if d != audio_delays[0]), 0)
        self.pre_audio_codebooks = leading
        self.young_steps = self.delay_steps + min(audio_delays[leading:], default=0)
        self.device = device = self.lm.text_linear.weight.device
        self.dtype = self.lm.text_linear.weight.dtype
        cross_spec = arch.conditioner(arch.fuser.cross[0]) if arch.fuser is not None and arch.fuser.cross else None
        self.voices = voices or VoiceFolder(
            None, arch.voice_suffix, cross_spec.dim if cross_spec else 0, settings.voice_frames
        )
        # CFG: distilled (a condition) when the checkpoint has a ``cfg`` conditioner, else direct.
        self.cfg_condition: str | None = None
        self.cfg_direct = False
        if arch.cfg_values:
            if settings.cfg_coef not in arch.cfg_values:
                raise EngineError(
                    f"cfg_coef={settings.cfg_coef} is not one this checkpoint was trained with {list(arch.cfg_values)}",
                    code=INVALID_VALUE,
                )
            self.cfg_condition = format(settings.cfg_coef, ".1f")
        elif settings.cfg_coef != 1.0:
            self.cfg_direct = True
        self.rows = rows = 2 * batch_size if self.cfg_direct else batch_size

        self.ids = TokenIds(card=c.text_card + 1, pad=c.text_padding_id)
        self.machine = TextMachine(
            MachineSettings(
                self.ids,
                arch.second_stream_ahead,
                settings.max_padding,
                settings.initial_padding,
                settings.max_words,
                settings.max_word_tokens,
            ),
            batch_size,
            device,
        )
        greedy = settings.temperature <= 0
        self.sampler = SlotSampler(
            batch_size,
            device,
            MoshiSampling(
                use_sampling=not greedy,
                temperature=settings.temperature,
                top_k=settings.top_k,
                temperature_text=settings.temperature,
                top_k_text=settings.top_k_text,
            ),
        )
        if pre_audio_only:  # its rows never pass young_steps positions: a ring of those slots alone
            # (a multiple of 8 of them: SDPA pads a mask of any other length, in every layer), not
            # the context's (tts-1.6b: 24 of 500 slots, 3 MB a row instead of 66)
            transformer = self.lm.transformer
            transformer.capacity = transformer.span = min(-(-max(1, self.young_steps) // 8) * 8, transformer.capacity)
        self.lm.start(rows)
        # A voice is one speaker: the other speakers' positions are padding, the same in every
        # row, so they are kept once (docs/engines.md#shared-cross-positions).
        self.cross_length = MAX_SPEAKERS * settings.voice_frames
        if arch.cross_attention:
            self.lm.transformer.start_cross(rows, settings.voice_frames, device, self.dtype)
            padding = self.loaded.conditioners.cross(None, self.cross_length)
            self.lm.transformer.set_cross_shared(padding[:, settings.voice_frames :])
        self.condition_sum = torch.zeros(rows, 1, c.dim, device=device, dtype=self.dtype)
        if not pre_audio_only:
            self.mimi.start(batch_size)
        self.ring = c.max_delay + 2
        self.cache = torch.full((batch_size, c.num_codebooks, self.ring), UNGENERATED_TOKEN, device=device)
        self.offsets = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.delays = torch.tensor(c.delays, dtype=torch.long, device=device)
        self.initial = torch.tensor([c.text_card] + [c.card] * c.n_q, dtype=torch.long, device=device)
        self.open = torch.zeros(batch_size, dtype=torch.bool, device=device)
        self._open_host = np.zeros(batch_size, bool)
        self.steps = np.zeros(batch_size, np.int64)  # per row, steps since it opened: ``offsets`` as last read
        self.active = torch.ones(batch_size, dtype=torch.bool, device=device)  # this step's ``active`` (graph input)
        self._active_host = np.ones(batch_size, bool)  # what ``active`` holds
        self._opening: dict[int, tuple[Voice | None, int | None]] = {}  # slots opened since the last flush
        self._voice_sum = self._sum(voice_given=True)  # a voiced stream's condition (the same for every voice)
        if self.cfg_direct:
            # The null twins of direct CFG are conditioned on nothing, once and for all.
            self.condition_sum[batch_size:] = self._sum(voice_given=False)
            if arch.cross_attention:
                twins = torch.arange(batch_size, rows, device=device)
                self.lm.transformer.set_cross_rows(twins, self._cross_rows(None))
        # Direct CFG's twin rows sit after every slot's row: the first rows are not a batch of their own.
        self.row_counts = buckets(batch_size, 0 if self.cfg_direct else row_bucket)
        self.spans = buckets(self.lm.transformer.capacity, span_bucket)
        self.step_rows, self.step_span = batch_size, self.spans[-1]  # what the last step computed
        self._views = {rows: self._first_rows(rows) for rows in self.row_counts[:-1]}
        self._views[batch_size] = self
        self._graphs: dict[tuple[bool, int, int], tuple[torch.cuda.CUDAGraph, StepOutputs]] = {}
        if device.type == "cuda" if graph is None else graph:
            self._capture()

    def _first_rows(self, rows: int) -> KyutaiTTSModel:
        """This model over its first ``rows`` slots: every piece of device state a view of this
        one's, so a step of the view is a step of this model whose other rows wait."""
        view = copy.copy(self)
        view.batch_size = view.rows = rows
        view.lm = first_rows(self.lm, rows)
        if not self.pre_audio_only:
            view.mimi = first_rows(self.mimi, rows)
        view.machine = self.machine.first_rows(rows)
        view.sampler = self.sampler.first_rows(rows)
        view.condition_sum, view.cache = self.condition_sum[:rows], self.cache[:rows]
        view.offsets, view.open, view.active = self.offsets[:rows], self.open[:rows], self.active[:rows]
        view._graphs, view._views = {}, {}
        return view

    def _capture(self) -> None:
        """Capture ``_advance`` for both kinds of step and every row count (no slot is open
        yet), then put every row back to fresh."""
        draws = self.sampler.draws.clone()
        kinds = [False] if self.pre_audio_only else [True, False]
        keys = [(speak, rows, span) for speak in kinds for rows in self.row_counts for span in self.spans]
        self._graphs = capture_graphs(lambda key: self._advance_over(*key), keys, self.device)
        self._reset_rows(torch.ones(self.batch_size, dtype=torch.bool, device=self.device))
        self.sampler.draws.copy_(draws)

    # -- slots ------------------------------------------------------------------------

    def resolve_voice(self, voice: str | None) -> Voice | None:
        """The voice a session asks for, checked (raises ``VoiceError``) before any slot is taken."""
        if not self.arch.multi_speaker:
            return None
        if voice is None:
            raise EngineError("this model needs a voice", code=INVALID_VALUE, param="voice")
        return self.voices.load(voice)

    def open_slot(self, slot: int, voice: Voice | None, seed: int | None = None) -> None:
        """Start a stream on ``slot``; its rows are reset on the device at the next ``flush``,
        together with every other slot opened meanwhile (one pass per tick, not one per stream:
        at 256 streams a reply opens every few ticks)."""
        self._opening[slot] = (voice, seed)
        self.machine.forget(slot)
        self.steps[slot] = 0
        self._open_host[slot] = True

    def release(self, slot: int) -> None:
        self._opening.pop(slot, None)
        self.open[slot] = False
        self._open_host[slot] = False
        self.machine.forget(slot)

    def flush(self) -> None:
        """Apply the slots opened and the words and ends pushed since the last flush (before a
        step)."""
        if self._opening:
            self._open_rows()
        self.machine.flush()

    def ready(self) -> npt.NDArray[np.bool_]:
        """``[B]`` bool: the open rows that hold the text they need to step (read on the host:
        ``TextMachine.ready_host``), and with tried steps the young rows that do not, unless
        their last try asked for a word and no text came since."""
        ready: npt.NDArray[np.bool_] = self._open_host & self.machine.ready_host()
        if self.tried_steps:
            ready |= self.young_rows() & ~self.machine.asked()
        return ready

    def _open_rows(self) -> None:
        opening, self._opening = self._opening, {}
        slots = torch.tensor(list(opening), dtype=torch.long).to(self.device)
        mask = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device).index_fill_(0, slots, True)
        self._reset_rows(mask)
        self.open.masked_fill_(mask, True)
        self.condition_sum.index_copy_(0, slots, self._voice_sum.expand(len(opening), -1, -1))
        by_voice: dict[int, tuple[Voice | None, list[int]]] = {}
        for slot, (voice, seed) in opening.items():
            self.sampler.configure(slot, None, seed)
            by_voice.setdefault(id(voice), (voice, []))[1].append(slot)
        if self.arch.cross_attention:
            for voice, rows in by_voice.values():
                self.lm.transformer.set_cross_rows(torch.tensor(rows, device=self.device), self._cross_rows(voice))

    def _cross_rows(self, voice: Voice | None) -> torch.Tensor:
        """The cross-attention positions a row of ``voice`` holds itself (its speaker's)."""
        return self.loaded.conditioners.cross(voice, self.cross_length)[:, : self.settings.voice_frames]

    def _reset_rows(self, mask: torch.Tensor) -> None:
        """The masked rows' device state back to a fresh stream's (in place: graph addresses stay)."""
        self.machine.reset_rows(mask)
        self.lm.reset_rows(self._rows(mask))
        if not self.pre_audio_only:
            self.mimi.reset_decoder_rows(mask)
        self.cache.masked_fill_(mask.view(-1, 1, 1), UNGENERATED_TOKEN)
        self.offsets.masked_fill_(mask, 0)

    def adopt(self, slot: int, nursery: KyutaiTTSModel, row: int) -> None:
        """``slot`` continues the stream ``nursery`` (a ``pre_audio_only`` model on the same
        weights and settings) stepped on ``row`` up to its first audio: every piece of its
        state moves here (keys and values, text machine, random stream, token ring), the
        decoder starts fresh as it would have, and ``row`` is free."""
        nursery.flush()
        self._opening.pop(slot, None)
        self.machine.forget(slot)
        mask = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self._reset_rows(mask)
        positions = int(nursery.steps[row])
        slots, rows = self._lm_rows(slot), nursery._lm_rows(row)
        self.lm.transformer.take_rows(slots, nursery.lm.transformer, rows, positions)
        self.condition_sum[slots] = nursery.condition_sum[rows]
        self.machine.take_row(slot, nursery.machine, row)
        self.sampler.take_rows(np.array([slot]), nursery.sampler, np.array([row]))
        self.cache[slot] = nursery.cache[row]
        self.offsets[slot] = nursery.offsets[row]
        self.open[slot] = True
        self._open_host[slot] = True
        self.steps[slot] = positions
        nursery.release(row)

    def young_rows(self) -> npt.NDArray[np.bool_]:
        """Open rows that make no audio yet: ``step(speak=False)`` steps them exactly."""
        young: npt.NDArray[np.bool_] = self._open_host & (self.steps < self.young_steps)
        return young

    def push_word(self, slot: int, tokens: list[int], padding: int) -> None:
        """Queue one word's tokens (empty: a pause) for ``slot``; raises ``ValueError`` past the backlog."""
        self.machine.push(slot, tokens, padding)

    def end_of_stream(self, slot: int) -> None:
        self.machine.end(slot)

    def _lm_rows(self, slot: int) -> torch.Tensor:
        """A slot's LM rows: itself, and its twin with direct CFG."""
        rows = [slot, slot + self.batch_size] if self.cfg_direct else [slot]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _rows(self, mask: torch.Tensor) -> torch.Tensor:
        """A ``[B]`` mask over slots -> the ``[rows]`` mask over LM rows (twins included)."""
        return mask.repeat(2) if self.cfg_direct else mask

    def _sum(self, *, voice_given: bool) -> torch.Tensor:
        values: dict[str, str | None] = {"control": "ok", "cfg": self.cfg_condition} if voice_given else {}
        summed = self.loaded.conditioners.summed(values)
        if summed is None:
            return torch.zeros(1, 1, self.config.dim, device=self.device, dtype=self.dtype)
        return summed.to(self.dtype)

    # -- the batched step -------------------------------------------------------------

    def step(self, active: npt.NDArray[np.bool_] | None = None, *, speak: bool = True) -> list[TTSFrame | None]:
        """Advance every open slot that has enough text (and is ``active``, where given: ``[B]``
        bool) by one frame. ``speak`` False: the pre-audio step, where only young rows
        (``young_rows``) step."""
        return self.read(self.launch(active, speak=speak))

    @torch.no_grad()
    def launch(
        self, active: npt.NDArray[np.bool_] | None = None, *, speak: bool = True, queued: int = 0
    ) -> StepOutputs:
        """``step``'s device part, queued on the current stream; ``read`` waits for it and hands
        out the frames (another model's step may run on another stream meanwhile). ``queued``:
        steps of this model launched and not read yet, which this one comes after (the rows'
        positions the host knows are that many steps behind; their outputs must be copies, as a
        graph's next replay overwrites its own)."""
        if speak and self.pre_audio_only:
            raise ValueError("a pre-audio-only model makes no audio")
        # Rows held back (their reader is behind) keep their state like waiting rows.
        # A blocking copy from the host waits for all the stream's queued work: the mask goes up
        # only when it changed, so a step queued behind others (a young burst) waits for none.
        wanted = np.ones(self.batch_size, bool) if active is None else active
        if not np.array_equal(wanted, self._active_host):
            self.active.copy_(torch.from_numpy(wanted))
            self._active_host = wanted.copy()
        self.flush()
        # Rows past the last that may step are left out (they would wait), and ring slots past the
        # furthest position of those that may step are not read: they hold nothing of theirs yet.
        # (A row in the view that waits, and is past the span, attends to slots of its own ring
        # in the window and makes finite outputs that are put back.)
        stepping = self._open_host if speak else self.young_rows()
        if active is not None:
            stepping = stepping & active
        indices = np.flatnonzero(stepping)
        last = int(indices[-1]) + 1 if indices.size else 1
        furthest = int(self.steps[indices].max()) + 1 + queued if indices.size else 1
        rows = self.row_counts[bisect.bisect_left(self.row_counts, last)]
        span = self.spans[min(bisect.bisect_left(self.spans, furthest), len(self.spans) - 1)]
        self.step_rows, self.step_span = rows, span
        if not self._graphs:
            return self._advance_over(speak, rows, span)
        graph, outputs = self._graphs[(speak, rows, span)]
        graph.replay()
        return outputs

    def _advance_over(self, speak: bool, rows: int, span: int) -> StepOutputs:
        view = self._views[rows]
        view.lm.transformer.span = span
        return view._advance(speak)

    def _advance(self, speak: bool) -> StepOutputs:
        """The step's device part: every input and all state are tensors updated in place."""
        c, b = self.config, self.batch_size
        may = self.open & self.active
        if not speak:  # a row past its audio delay would need every codebook: it waits
            may = may & (self.offsets < self.young_steps)
        execute = may & self.machine.ready()
        # A young row without the words tries the step, kept unless the model asks for one.
        trying = may & ~execute & (self.offsets < self.young_steps) if self.tried_steps else torch.zeros_like(may)
        stepping = execute | trying
        rows = torch.arange(b, device=self.device)
        used = 1 + self.codebooks
        # Codebooks past ``codebooks`` are never generated: their inputs are "no token".
        if used < c.num_codebooks:
            skipped = torch.arange(used, c.num_codebooks, device=self.device)
            positions = (self.offsets[:, None] + self.delays[skipped][None]) % self.ring
            current = self.cache[rows[:, None], skipped[None], positions]
            self.cache[rows[:, None], skipped[None], positions] = torch.where(stepping[:, None], ZERO_TOKEN, current)
        column = self.cache[rows, :, self.offsets % self.ring]
        fresh = self.offsets[:, None] <= self.delays[None]
        column = torch.where(fresh | ~stepping[:, None], self.initial[None], column)
        if self.cfg_direct:
            null_text = torch.where(fresh[:, :1], column[:, :1], ZERO_TOKEN)
            column = torch.cat([column, torch.cat([null_text, column[:, 1:]], dim=1)])
        x = self.lm.embed(column) + self.condition_sum
        before = self.lm.transformer.offset.clone()
        draws_before = self.sampler.draws.clone()  # the sampler draws for every row: waiting rows' are put back
        hidden, text_logits = self.lm.temporal(x)
        text_logits = text_logits[:b].float()
        if self.settings.padding_bonus:
            text_logits[:, self.ids.pad] += self.settings.padding_bonus
        sampled = self.sampler.sample(text_logits, text=True)
        asked = trying & self.machine.asks_word(sampled)
        execute = execute | (trying & ~asked)
        self.lm.transformer.offset.copy_(torch.where(self._rows(execute), self.lm.transformer.offset, before))
        machine = self.machine.step(sampled, self.offsets, execute)
        text = machine.tokens

        tokens = [text]
        if speak:
            tokens += self._speak(hidden, text, self.codebooks)
        else:  # the later codebooks are "no token" yet; the draws move as the depformer's would
            tokens += self._speak(hidden, text, self.pre_audio_codebooks)
            later = self.codebooks - self.pre_audio_codebooks
            tokens += [torch.full_like(text, ZERO_TOKEN)] * later
            self.sampler.draws.add_(later)
        generated = torch.stack(tokens, dim=1)  # [B, 1 + codebooks]

        offsets = self.offsets + execute.long()
        write = offsets % self.ring
        current = self.cache[rows, :used, write]
        self.cache[rows, :used, write] = torch.where(execute[:, None], generated, current)
        self.offsets.copy_(offsets)
        index = (offsets[:, None] - c.max_delay + self.delays[:used][None]) % self.ring
        frame = self.cache[rows[:, None], torch.arange(used, device=self.device)[None], index]
        # Frame t (t = steps before this one - max_delay) carries real audio from t = delay_steps on.
        audible = execute & (offsets - 1 - c.max_delay >= self.delay_steps)
        if speak:
            audio = self.mimi.decode(frame[:, 1:].clamp(min=0), hold=~audible).clamp(-0.99, 0.99)
        else:  # nothing is audible yet: no row's decoder state moves
            audio = torch.zeros(b, self.frame_size, device=self.device)
        self.sampler.draws.copy_(torch.where(execute, self.sampler.draws, draws_before))
        end = self.machine.end_step + self.delay_steps + self.settings.final_padding + c.max_delay
        done = execute & self.machine.eos & (self.machine.end_step >= 0) & (offsets >= end)

        out = offsets > c.max_delay
        pops_none = self.machine.pops_none()  # tells the host whether the next step may wait for text
        asked = asked | self.machine.must_pop()  # and whether a try of it without the words would be in vain
        flags = torch.stack([execute, audible, machine.consumed, done, machine.overflow, out, pops_none, asked])
        return flags, frame, audio.float()

    def _speak(self, hidden: torch.Tensor, text: torch.Tensor, codebooks: int) -> list[torch.Tensor]:
        """The depformer's audio tokens of this frame for its first ``codebooks``, after ``text``."""
        tokens: list[torch.Tensor] = []
        previous = text
        # The audio lags its text by ``audio_delay``: before that, "no token" (every codebook's
        # rows at once, not two kernels per codebook).
        early = self.offsets[:, None] < self.delays[1 : 1 + codebooks] + self.delay_steps
        self.lm.depformer_begin()
        for codebook in range(codebooks):
            given = torch.cat([previous, previous]) if self.cfg_direct else previous
            logits = self.lm.depformer_logits(codebook, hidden, given)
            if self.cfg_direct:
                conditioned, null = logits.chunk(2)
                logits = null + (conditioned - null) * self.settings.cfg_coef
            token = torch.where(early[:, codebook], ZERO_TOKEN, self.sampler.sample(logits, text=False))
            tokens.append(token)
            previous = token
        return tokens

    def read(self, launched: StepOutputs) -> list[TTSFrame | None]:
        """A launched step's outputs to the host (on the stream it ran on), one entry per open slot."""
        flags, frame, audio = launched
        host = flags.cpu().numpy()
        rows = host.shape[1]  # the step's rows: the others waited
        self.steps[:rows] += host[0]
        out = host[0] & host[5]
        codes_host = frame.cpu().numpy()
        audio_host = audio.cpu().numpy()
        outputs: list[TTSFrame | None] = [None] * self.batch_size
        stepped_open = np.flatnonzero(self._open_host[:rows])
        self.machine.read_pops_none(stepped_open, host[6, stepped_open].astype(bool))
        self.machine.read_asked(stepped_open, host[0, stepped_open].astype(bool), host[7, stepped_open].astype(bool))
        for slot in np.flatnonzero(self._open_host):
            if slot >= rows:  # opened since the launch
                outputs[slot] = TTSFrame(False, None, None, 0, False, False)
                continue
            stepped, heard, consumed, finished, overflow = host[:5, slot]
            if consumed:
                self.machine.popped(slot)
            outputs[slot] = TTSFrame(
                bool(stepped),
                codes_host[slot].copy() if out[slot] else None,
                audio_host[slot].copy() if heard else None,
                int(consumed),
                bool(finished),
                bool(overflow),
            )
        return outputs
