"""``SttFrameModel``: a Kyutai STT checkpoint as a lockstep ``FrameModel`` (docs/engines.md#kyutai-stt-engine).

One ``step`` = one 80 ms tick for all B slots: Mimi-encode every row's frame, one temporal
step (``TokenStream`` with no depformer: the text token is the only output), and the
extra heads on the same temporal output. Every row steps every tick (idle rows on
silence), so the batch is one fixed shape; only live rows' outputs are returned. The tick
is the Moshi engine's ``FrameStep`` for a listener: on a GPU it replays as CUDA graphs, its
attention reads only the context the open rows have reached, and with ``paged_kv`` the
temporal KV is int8 blocks from one pool (docs/engines.md#one-graph-per-frame).

Opening a slot resets just that row of every cache (the transformer's KV and position, the
token ring, the Mimi encoder's convolution and transformer state) and plans the silence
prefix as prefill: the scheduler steps a prefilling row with silence, exactly the frames the
reference feeds before an utterance. Other rows' outputs stay bit-identical (isolation).

Between ticks the scheduler may run drain steps (``step_rows``, built with ``drains``): only
the rows whose input stood queued (or came late) advance, on their next frame, and every other
row is held, its state put back as it was; a tick whose live row waits for a late frame is such
a step too (docs/engines.md#draining-waiting-input). With ``flush_rows`` a drain step of that many
rows or fewer runs in a batch of its own on the same weights instead: their state is copied in,
stepped and copied back, so the step costs a few rows' compute, not the whole batch's
(docs/engines.md#flush-rows); ``step_rows_burst`` steps such rows several frames in one call, the
state copied once each way (docs/engines.md#drain-bursts).

Each live row's output carries a ``TranscriptStep``: the step number, the text token that
came out (the reference ``LMGen``'s output: it trails the token's generation by the LM's
largest stream delay), and per extra head the probability of its first class (end of turn).
No audio comes out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.kyutai_stt.loader import SttModel
from rtserve.engines.moshi.frame_step import FrameStep, FrameTensors
from rtserve.engines.moshi.paged_kv import PagedKVSpec
from rtserve.engines.moshi.row_views import sharing_weights
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.values import FrameOutput, SlotPrompt, TranscriptStep

_NO_AUDIO = np.zeros(0, np.float32)


class SttFrameModel:
    def __init__(
        self,
        model: SttModel,
        batch_size: int,
        *,
        temperature: float = 0.0,
        graph: bool | None = None,
        paged_kv: PagedKVSpec | None = None,
        drains: bool = False,
        flush_rows: int = 0,
    ) -> None:
        """``temperature`` 0 is greedy (the reference servers' default); ``graph``: replay the tick as
        CUDA graphs (default: on a CUDA device); ``paged_kv``: int8 KV blocks from one pool
        (``open_slot`` then raises ``KVMemoryExhausted`` when no block is free); ``drains``:
        ``step_rows`` may step some rows while the others hold (one more graph per span);
        ``flush_rows`` (with ``drains``, ring KV): the size of the batch of its own that drain steps
        of that many rows or fewer run in (0: none)."""
        loaded = model.loaded
        self.model = model
        self.settings = model.settings
        self.config = loaded.lm_config
        self.batch_size = batch_size
        self.sample_rate = loaded.mimi_config.sample_rate
        self.frame_size = loaded.mimi_config.frame_size
        # A token comes out max_delay steps after it is made (drains wait for it).
        self.output_delay_frames = self.config.max_delay
        self.lm = loaded.lm
        self.mimi = loaded.mimi
        self.device = loaded.lm.text_linear.weight.device
        sampling = MoshiSampling(use_sampling=temperature > 0, temperature_text=temperature, top_k_text=0)
        self.sampler = SlotSampler(batch_size, self.device, sampling)
        graph = self.device.type == "cuda" if graph is None else graph
        if paged_kv is not None or self.lm.transformer.paged is not None:
            self.lm.transformer.use_paged_kv(paged_kv)
        self.frame = FrameStep(self.lm, self.mimi, self.sampler, batch_size, graph=graph, holds=drains)
        self.flush: FrameStep | None = None
        if drains and flush_rows:
            if self.lm.transformer.paged is not None:
                raise ValueError("flush rows need ring KV (paged KV hands its blocks out per row of one pool)")
            lm, mimi = sharing_weights(self.lm), sharing_weights(self.mimi)
            self.flush = FrameStep(lm, mimi, SlotSampler(flush_rows, self.device, sampling), flush_rows, graph=graph)
        self.burst_rows = flush_rows if self.flush is not None else 0  # DrainsInput: bursts run in the flush batch
        self._open = np.zeros(batch_size, bool)  # opened and not released: the rows attention must cover
        self.steps = np.zeros(batch_size, np.int64)  # per row: steps since it opened
        self._prefill_left = np.zeros(batch_size, np.int64)
        self._pieces = [
            model.tokenizer.id_to_piece(i).replace("\u2581", " ") for i in range(model.tokenizer.vocab_size())
        ]

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        self.frame.admit(slot)  # may raise KVMemoryExhausted (paged KV)
        mask = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.frame.reset_rows(mask)
        self.sampler.configure(slot, None, prompt.seed)
        self._open[slot] = True
        self.steps[slot] = 0
        self._prefill_left[slot] = self.settings.prefix_frames
        return self.settings.prefix_frames

    def prefill_step(self, slot: int) -> bool:
        self._prefill_left[slot] -= 1
        return bool(self._prefill_left[slot] <= 0)

    def release(self, slot: int) -> None:
        self.frame.release(slot)
        self._open[slot] = False
        self._prefill_left[slot] = 0

    @torch.no_grad()
    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        pcm = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32)).to(self.device)
        result = self.frame(pcm, self._open)
        self.steps += 1
        slots = np.flatnonzero(live)
        return self._outputs(result, slots, slots)

    @torch.no_grad()
    def step_rows(self, frames: FloatArray, stepped: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        """A drain step (``DrainsInput``): only the ``stepped`` rows advance, on their frames."""
        slots = np.flatnonzero(stepped)
        if self.flush is not None and slots.size <= self.flush.batch:
            return self.step_rows_burst(frames[slots][None], slots)[0]
        pcm = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32)).to(self.device)
        result = self.frame(pcm, self._open, hold=~stepped)
        self.steps += stepped
        return self._outputs(result, slots, slots)

    @torch.no_grad()
    def step_rows_burst(self, frames: FloatArray, slots: npt.NDArray[np.intp]) -> list[list[FrameOutput | None]]:
        """Drain steps of a few rows back to back (``DrainsInput``), in the flush batch (its first
        rows; the others step on what they last held, which no one reads): their state is copied
        in once and back once, and the host reads the outputs after the last step was queued
        (docs/engines.md#drain-bursts)."""
        flush, n = self.flush, slots.size
        assert flush is not None and n <= flush.batch
        rows = np.arange(n)
        flush.take_rows(rows, self.frame, slots)
        pcm = np.zeros((frames.shape[0], flush.batch, self.frame_size), np.float32)
        pcm[:, :n] = frames
        pcm_device = torch.from_numpy(pcm).to(self.device)
        active = np.arange(flush.batch) < n
        kept: list[FrameTensors] = []
        for step in pcm_device:
            out = flush(step, active)  # a graphed step's outputs are overwritten by the next: keep copies
            scores = None if out.scores is None else out.scores[:n].clone()
            kept.append(FrameTensors(out.tokens[:n].clone(), out.ready[:n].clone(), out.audio, scores))
        self.frame.take_rows(slots, flush, rows)
        outputs: list[list[FrameOutput | None]] = []
        for result in kept:
            self.steps[slots] += 1
            outputs.append(self._outputs(result, slots, rows))
        return outputs

    def _outputs(
        self, result: FrameTensors, slots: npt.NDArray[np.intp], rows: npt.NDArray[np.intp]
    ) -> list[FrameOutput | None]:
        """The outputs of ``slots``, read from ``result``'s ``rows`` (pairwise)."""
        # One pass over plain Python values: at B=512 this loop is a few ms of every tick.
        tokens = result.tokens[:, 0].tolist()
        ready = result.ready.tolist()
        scores: list[tuple[float, ...]] = (
            [()] * len(ready) if result.scores is None else list(map(tuple, result.scores.float().tolist()))
        )
        indices = (self.steps - 1).tolist()
        piece = self._piece
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        for slot, row in zip(slots.tolist(), rows.tolist(), strict=True):
            if not ready[row]:
                outputs[slot] = FrameOutput(_NO_AUDIO)
                continue
            token = tokens[row]
            outputs[slot] = FrameOutput(
                _NO_AUDIO, piece(token), transcript=TranscriptStep(indices[slot], token, scores[row])
            )
        return outputs

    def _piece(self, token: int) -> str | None:
        c = self.config
        if token in (c.text_padding_id, c.text_end_padding_id) or not 0 <= token < len(self._pieces):
            return None
        return self._pieces[token] or None
