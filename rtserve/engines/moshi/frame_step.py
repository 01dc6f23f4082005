"""The whole per-frame computation for B slots (Mimi encode -> temporal + depformer step ->
Mimi decode) as one callable, replayed as one CUDA graph on a GPU (docs/engines.md#one-graph-per-frame).

Why one graph: at the 7B shape one frame is a few thousand small kernels (32 temporal
layers, ``dep_q`` x 6 depformer layers, the SEANet codec); launched one by one from Python
they cost ~200 ms whatever B is. Every tensor the step reads or writes is allocated before
capture (KV caches, offsets, the token ring, the override buffers, ``pcm``), so a replay
is a pure function of their contents and the only host sync left is the caller's copy of
the outputs.

Cost follows the real context: temporal attention reads only the ring slots the active
rows (the frame model's open slots) have reached, rounded up to ``span_bucket`` frames
(one graph per such span, captured up front). The host mirrors every row's position, so
picking the span needs no device sync.

With paged KV (``Transformer.use_paged_kv``) the host also hands out KV blocks: before each
step every active row gets the block its next position writes to (``BlockAllocator``), and
the block table is copied to the device only when it changed. ``admit`` takes a fresh
conversation's first block (``KVMemoryExhausted`` when none is free), ``release`` gives a
row's blocks back.

A listener (Kyutai STT: ``dep_q`` 0) has no agent audio to decode: its step is Mimi encode,
the temporal step and its extra heads (``FrameTensors.scores``), and ``audio`` is ``[B, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from rtserve.engines.moshi.cuda_graph import capture_graphs
from rtserve.engines.moshi.generator import StepOverrides, TokenStream
from rtserve.engines.moshi.lm import MoshiLM
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.paged_kv import BlockAllocator, PagedKVCache, qmax
from rtserve.engines.moshi.row_views import buckets
from rtserve.engines.moshi.sampling import SlotSampler

# Temporal attention spans are multiples of this many frames (each one graph).
DEFAULT_SPAN_BUCKET = 256


@dataclass(frozen=True)
class FrameTensors:
    tokens: torch.Tensor  # [B, 1 + dep_q]: text + agent codebooks, delays undone
    ready: torch.Tensor  # [B] bool: the row has emitted its first frame
    audio: torch.Tensor  # [B, frame_size] float: decoded agent audio (zeros while not ready); [B, 0] for a listener
    scores: torch.Tensor | None = None  # [B, extra_heads] the extra heads' first-class probabilities (if any)


class FrameStep:
    """Owns the batched streaming state of ``lm`` and ``mimi`` for ``batch`` rows.

    ``graph=True`` (CUDA only) captures the step at construction, once per attention span
    (sampling settings are tensors the graph reads, so slots may change them at any time).
    Outputs of a graphed step are static buffers, overwritten by the next call.
    """

    def __init__(
        self,
        lm: MoshiLM,
        mimi: Mimi,
        sampler: SlotSampler,
        batch: int,
        *,
        graph: bool = False,
        span_bucket: int = DEFAULT_SPAN_BUCKET,
        holds: bool = False,
    ) -> None:
        self.config = lm.config
        self.lm = lm
        self.mimi = mimi
        self.batch = batch
        device = lm.text_linear.weight.device
        self.device = device
        mimi.start(batch)
        self.stream = TokenStream(lm, batch, sampler)
        self.overrides = StepOverrides.none(
            batch, 1 + self.config.dep_q, self.config.dim, device, lm.text_linear.weight.dtype
        )
        self.pcm = torch.zeros(batch, mimi.frame_size, device=device)
        self.hold = torch.zeros(batch, dtype=torch.bool, device=device)  # rows a holding step leaves as they were
        self._holds = holds
        capacity = lm.transformer.capacity
        self.spans = buckets(capacity, span_bucket)
        # Host mirror of every row's temporal position (lm.transformer.offset); writable by
        # whoever sets the device positions directly (the benchmarks' cache prefill).
        self.positions = np.zeros(batch, np.int64)
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, FrameTensors]] = {}
        if graph:
            if device.type != "cuda":
                raise ValueError("CUDA graphs need a CUDA device")
            self._capture()

    @property
    def graphed(self) -> bool:
        return bool(self._graphs)

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Return the masked rows to a fresh conversation (in place: graph addresses stay valid)."""
        self.stream.reset_rows(mask)
        self.mimi.reset_encoder_rows(mask)
        self.mimi.reset_decoder_rows(mask)
        self.positions[mask.cpu().numpy()] = 0

    def take_rows(self, rows: npt.NDArray[np.intp], source: FrameStep, source_rows: npt.NDArray[np.intp]) -> None:
        """Rows ``rows`` continue ``source``'s ``source_rows`` (``source`` steps another batch on
        the same weights, its modules ``row_views.sharing_weights`` copies): the LM's rings and
        positions, the token ring, the random streams and Mimi's encoder. A listener's only (no
        depformer, so no Mimi decoder state), with rings (paged KV hands its blocks out per row
        of one allocator)."""
        if self.config.dep_q:
            raise ValueError("rows move between listeners' frame steps only (no Mimi decoder state)")
        mine, theirs = torch.from_numpy(rows).to(self.device), torch.from_numpy(source_rows).to(self.device)
        self.stream.take_rows(mine, source.stream, theirs)
        self.stream.sampler.take_rows(rows, source.stream.sampler, source_rows)
        self.mimi.take_encoder_rows(mine, source.mimi, theirs)
        self.positions[rows] = source.positions[source_rows]

    @property
    def blocks(self) -> BlockAllocator | None:
        """The temporal transformer's KV block allocator (None: bf16 rings)."""
        return self.lm.transformer.blocks

    def admit(self, row: int) -> None:
        """Give ``row`` its first KV block (paged KV; no-op with rings) or raise ``KVMemoryExhausted``."""
        if self.blocks is not None:
            self.blocks.admit(row)

    def release(self, row: int) -> None:
        """Give ``row``'s KV blocks back to the pool (paged KV; no-op with rings)."""
        if self.blocks is not None:
            self.blocks.release(row)

    def advance(self, row: int, frames: int) -> None:
        """Benchmarking: ``row`` (just reset) continues as if ``frames`` frames of conversation had
        been stepped: its temporal position and KV length are ``frames`` (random keys and values;
        paged KV: the blocks that window holds, or ``KVMemoryExhausted``). The token delays and
        Mimi start fresh. Attention then reads what a conversation that long reads, at no cost
        of stepping it (docs/engines.md#context-fill)."""
        transformer = self.lm.transformer
        if self.blocks is not None:
            self.blocks.advance(row, frames)
        else:
            for cache in transformer.caches:
                cache.keys[row].normal_()
                cache.values[row].normal_()
        transformer.offset[row] = frames
        self.positions[row] = frames

    def randomize_kv_pools(self) -> None:
        """Benchmarking (paged KV): random keys and values in every block (any byte: an int8
        value or two 4-bit ones), scaled as N(0, 1) entries quantize, for rows started by
        ``advance`` to read."""
        for cache in self.lm.transformer.caches:
            if isinstance(cache, PagedKVCache):
                for pool in (cache.keys, cache.values):
                    pool.random_(-128, 128)
                for scales in (cache.key_scales, cache.value_scales):
                    scales.fill_(3.0 / qmax(cache.bits))

    def span(self, active: npt.NDArray[np.bool_] | None = None) -> int:
        """The fewest ring slots (a bucket) that hold the context of every ``active`` row (all
        rows when None) for the next step. An inactive row past the span still sees some valid
        slots (with the window as long as the ring, slot 0 always holds a position inside it),
        so its output is finite garbage that nobody reads, and opening it resets its state."""
        positions = self.positions if active is None else self.positions[active]
        needed = int(positions.max()) + 1 if positions.size else 1
        return next((s for s in self.spans if s >= needed), self.spans[-1])

    @torch.no_grad()
    def __call__(
        self,
        pcm: torch.Tensor,
        active: npt.NDArray[np.bool_] | None = None,
        hold: npt.NDArray[np.bool_] | None = None,
    ) -> FrameTensors:
        """``pcm`` ``[B, frame_size]``; ``self.overrides`` staged by the caller apply to this step
        only; ``active`` ``[B]`` bool marks the rows whose outputs matter (default: all);
        ``hold`` (a ``holds`` step only) the rows that do not advance: their state stays as it
        was and their outputs mean nothing (Kyutai STT stepping only the rows whose input waited)."""
        if hold is not None and not self._holds:
            raise ValueError("this FrameStep was built without holds=True")
        self.pcm.copy_(pcm)
        span = self.span(active)
        advancing = active
        if hold is not None:
            advancing = ~hold if active is None else active & ~hold
            self.hold.copy_(torch.from_numpy(hold))
        if self.blocks is not None:
            rows = np.arange(self.batch) if advancing is None else np.flatnonzero(advancing)
            self.blocks.ensure(rows, self.positions)
            self.blocks.sync()
        if hold is None:
            self.positions += 1
        else:
            self.positions += ~hold
        key = (span, hold is not None)
        if not self._graphs:
            return self._step(key)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def _step(self, key: tuple[int, bool]) -> FrameTensors:
        span, holding = key
        hold = self.hold if holding else None
        c = self.config
        user = self.mimi.encode(self.pcm, hold)[:, : c.user_codebooks]
        self.lm.transformer.span = span
        try:
            result = self.stream.step(user, self.overrides, hold)
        finally:
            self.lm.transformer.span = None  # the lm may be shared (prompt encoding, tests): leave it unbounded
        scores = self.lm.extra_head_probs(result.hidden)[:, :, 0] if c.extra_heads else None
        self.overrides.clear()
        if not c.dep_q:
            return FrameTensors(result.tokens, result.ready, self.pcm[:, :0], scores)
        audio = self.mimi.decode(result.tokens[:, 1 : 1 + c.agent_codebooks].clamp(min=0), hold)
        # Rows whose first frame is not out yet decoded a placeholder: put their decoder back to fresh.
        not_ready = ~result.ready
        self.mimi.reset_decoder_rows(not_ready)
        audio = torch.where(not_ready[:, None], torch.zeros_like(audio), audio)
        return FrameTensors(result.tokens, result.ready, audio, scores)

    def _capture(self) -> None:
        draws = self.stream.sampler.draws.clone()
        keys = [(span, holding) for span in self.spans for holding in ((False, True) if self._holds else (False,))]
        self._graphs = capture_graphs(self._step, keys, self.device)
        # The warm-up steps advanced every row and its random stream (capture itself runs
        # nothing): start all rows fresh, each stream where it was.
        self.reset_rows(torch.ones(self.batch, dtype=torch.bool, device=self.device))
        for row in range(self.batch):
            self.release(row)
        self.stream.sampler.draws.copy_(draws)
