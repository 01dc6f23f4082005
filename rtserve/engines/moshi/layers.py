"""Transformer building blocks shared by the temporal transformer, the depformer and Mimi.

Numerics follow the published Moshi recipe (docs/engines.md#numerics-and-parity): RMSNorm computed in fp32,
interleaved RoPE computed in fp32, gated SiLU MLP, causal attention over a ring KV cache.
The order of floating-point operations is kept the same as the reference so that greedy
decoding agrees token for token in fp32 (the parity gate).

Streaming state is data, not objects: every cache is a batched tensor with one row per
slot, and ``reset_rows(mask)`` returns the masked rows to their fresh state in place
(same storage, so addresses stay static for CUDA graphs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import torch
from torch import nn
from torch.nn import functional as F

from rtserve.engines.moshi import fused
from rtserve.engines.moshi.paged_kv import BlockAllocator, PagedKVCache, PagedKVSpec

ModuleT = TypeVar("ModuleT", bound=nn.Module)
_T = TypeVar("_T")


class TypedModuleList(nn.ModuleList, Generic[ModuleT]):
    """An ``nn.ModuleList`` of one kind of module that the type checker indexes and iterates as
    that kind (torch types every item as a bare ``nn.Module``). At run time it is a ModuleList."""

    def __init__(self, modules: Iterable[ModuleT] = ()) -> None:
        super().__init__(modules)

    if TYPE_CHECKING:

        @overload
        def __getitem__(self, idx: slice) -> TypedModuleList[ModuleT]: ...
        @overload
        def __getitem__(self, idx: int) -> ModuleT: ...
        def __getitem__(self, idx: int | slice) -> ModuleT | TypedModuleList[ModuleT]: ...
        def __iter__(self) -> Iterator[ModuleT]: ...


class RMSNorm(nn.Module):
    """RMSNorm whose statistics are always taken in fp32 (``rms_norm_f32``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.alpha, self.eps)


def make_norm(kind: str, dim: int) -> nn.Module:
    """The normalisation a Kyutai config names; eps values are the published ones."""
    if kind == "rms_norm_f32":
        return RMSNorm(dim, eps=1e-8)
    if kind == "rms_norm":
        return RMSNorm(dim, eps=1e-5)
    if kind == "layer_norm":
        return nn.LayerNorm(dim, eps=1e-5)
    raise ValueError(f"unsupported norm {kind!r}")


def rope_tables(offset: torch.Tensor, steps: int, dim: int, max_period: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[B, 1, T, dim/2]`` of the interleaved rotary embedding at per-row positions ``offset + t``."""
    batch = offset.shape[0]
    half = torch.arange(dim // 2, device=offset.device, dtype=torch.float32)
    freqs = torch.exp(half * (-math.log(max_period) * 2 / dim))
    ts = offset.float().view(-1, 1) + torch.arange(steps, device=offset.device, dtype=torch.float32)
    ts = ts.view(batch, 1, -1, 1)
    return torch.cos(freqs * ts), torch.sin(freqs * ts)


def step_holding(hold: torch.Tensor, state: list[torch.Tensor], call: Callable[[], _T]) -> _T:
    """``call()``, a batched step that updates ``state`` (``[B, ...]`` tensors) in place, with the
    rows in ``hold`` (``[B]`` bool) put back as they were: they took part without advancing. No
    host sync, so a captured graph can do it."""
    kept = [tensor.clone() for tensor in state]
    out = call()
    for tensor, old in zip(state, kept, strict=True):
        tensor.copy_(torch.where(hold.view(-1, *([1] * (tensor.dim() - 1))), old, tensor))
    return out


class GatedMLP(nn.Module):
    """``linear_out(silu(a) * b)`` where ``[a, b] = linear_in(x)``."""

    def __init__(self, dim: int, dim_feedforward: int) -> None:
        super().__init__()
        # The published sizing rule: 8/3 expansion, or 21/8 when the config asks for 4x.
        hidden = (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.linear_in.weight)
        batch, steps, _ = h.shape
        h = h.view(batch, steps, 2, -1)
        return F.linear(fused.silu_gate(h), self.linear_out.weight)


class GeluMLP(nn.Module):
    """Mimi's plain feed-forward: ``linear2(gelu(linear1(x)))``."""

    def __init__(self, dim: int, dim_feedforward: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, dim_feedforward, bias=False)
        self.linear2 = nn.Linear(dim_feedforward, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear2(F.gelu(self.linear1(x)))
        return out


@dataclass
class KVCache:
    """Ring buffers of one attention layer: keys and values ``[B, H, capacity, D]``, the two halves
    of one ``[2, B, H, capacity, D]`` tensor, so a step writes both with one copy or scatter."""

    pair: torch.Tensor

    @classmethod
    def empty(
        cls, batch: int, heads: int, capacity: int, head_dim: int, device: torch.device, dtype: torch.dtype
    ) -> KVCache:
        return cls(torch.zeros((2, batch, heads, capacity, head_dim), device=device, dtype=dtype))

    @property
    def keys(self) -> torch.Tensor:
        return self.pair[0]

    @property
    def values(self) -> torch.Tensor:
        return self.pair[1]

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Every row's memory is read and written (no host sync: what a captured graph does)."""
        self.pair.masked_fill_(mask.view(1, -1, 1, 1, 1), 0.0)

    def clear(self, rows: torch.Tensor) -> None:
        """Zero the listed rows only (``rows``: indices): what opening a slot needs. A masked fill
        over ``[B, H, capacity, D]`` touches every row: 6 ms per open at B=512 (stt-1b on an H200),
        the engine thread's largest item while 512 sessions opened."""
        self.pair.index_fill_(1, rows, 0.0)


@dataclass(frozen=True)
class StepPlan:
    """What every layer of one transformer step shares, computed once per step instead of
    once per layer (at the 7B shape that is ~1,000 fewer small kernels per frame): where the
    new keys go in the ring, which ring slots each query may see, and the RoPE tables.

    ``span`` (when every row's ``offset + T`` is at most ``span``, i.e. no row has wrapped
    past it) limits attention to the first ``span`` ring slots: the slots beyond hold
    nothing yet, so a young batch pays for its real context instead of the whole ring.
    """

    write: torch.Tensor  # [B, H, T, D] ring slot of each new key/value
    # [B, 1, T, span] added to the scores: 0 where query t may attend to ring slot s, else -inf;
    # None: every slot of the span (rows in step before their ring wraps)
    mask: torch.Tensor | None
    span: int
    rope: tuple[torch.Tensor, torch.Tensor] | None
    slot: torch.Tensor  # [B, T] ring slot of each new key/value
    offset: torch.Tensor  # [B] position of each row's first new entry
    floor: torch.Tensor | None  # [B] first position each row may attend to (paged KV), None: 0
    capacity: int
    context: int | None
    shared_slot: int | None = None  # every row writes this ring slot (rows in step): a copy, not a scatter

    @classmethod
    def build(
        cls,
        offset: torch.Tensor,
        steps: int,
        heads: int,
        head_dim: int,
        capacity: int,
        context: int | None,
        span: int | None,
        rope_max_period: float | None,
        floor: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> StepPlan:
        """A ring slot's absolute position is recovered from the row's offset, so rows at
        different positions (a recycled slot next to a long-running one) share one batched call.
        The mask is additive in ``dtype`` (the queries'): attention would otherwise turn a bool mask
        into that in every layer (two kernels each)."""
        span = capacity if span is None else min(span, capacity)
        write, mask = _ring_layout(offset, floor, steps, capacity, context, span, dtype)
        index = write.view(offset.shape[0], 1, steps, 1).expand(-1, heads, -1, head_dim)
        rope = None if rope_max_period is None else rope_tables(offset, steps, head_dim, rope_max_period)
        return cls(index, mask, span, rope, write, offset, floor, capacity, context)


@fused.fused
def _ring_layout(
    offset: torch.Tensor,
    floor: torch.Tensor | None,
    steps: int,
    capacity: int,
    context: int | None,
    span: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``StepPlan.build``'s tensors: each row's ring slot for its new entries ``[B, T]`` and the
    additive mask ``[B, 1, T, span]`` (about 25 small kernels eager, a couple compiled)."""
    device = offset.device
    arange_t = torch.arange(steps, device=device, dtype=torch.long)
    write = (offset.view(-1, 1) + arange_t) % capacity  # [B, T]
    slots = torch.arange(span, device=device, dtype=torch.long)
    last = offset.view(-1, 1) + steps - 1  # absolute position of the newest entry, [B, 1]
    delta = slots - last % capacity
    pos_k = torch.where(delta <= 0, last + delta, last + delta - capacity)  # [B, S]
    pos_k = torch.where(slots >= (offset + steps).view(-1, 1), torch.full_like(pos_k, -1), pos_k)
    pos_q = offset.view(-1, 1, 1) + arange_t.view(-1, 1)  # [B, T, 1]
    rel = pos_q - pos_k[:, None]  # [B, T, S]
    allowed = (pos_k[:, None] >= 0) & (rel >= 0)
    if floor is not None:
        allowed = allowed & (pos_k >= floor.view(-1, 1))[:, None]
    if context is not None:
        allowed = allowed & (rel < context)
    mask = torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return write, mask[:, None]


def ring_attention(q: torch.Tensor, kv: torch.Tensor, cache: KVCache | PagedKVCache, plan: StepPlan) -> torch.Tensor:
    """Write ``kv`` (keys and values, ``[2, B, H, T, D]``) into the ring and attend over the slots
    ``plan`` allows."""
    if isinstance(cache, PagedKVCache):
        assert plan.floor is not None and plan.mask is not None
        return cache.attend(
            q, kv[0], kv[1], plan.slot, plan.offset, plan.floor, plan.mask, plan.span, plan.capacity, plan.context
        )
    if plan.shared_slot is not None:
        cache.pair[:, :, :, plan.shared_slot : plan.shared_slot + kv.shape[3]].copy_(kv)
    else:
        cache.pair.scatter_(3, plan.write.expand(2, *plan.write.shape), kv)
    keys, values = cache.keys, cache.values
    if plan.span < keys.shape[2]:
        keys, values = keys[:, :, : plan.span], values[:, :, : plan.span]
    if q.is_cuda and q.dtype == torch.float32:
        return explicit_attention(q, keys, values, plan.mask)
    return F.scaled_dot_product_attention(q, keys, values, plan.mask, dropout_p=0.0)


def explicit_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Softmax attention as two batched matmuls, what SDPA computes. Used for fp32 on CUDA (Mimi's
    transformers): there SDPA's only kernel (memory-efficient) tiles queries by 64, and a streaming
    step has 1-2, so it took ~3x the time of reading the keys and values (H200, B=256)."""
    scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    if mask is not None:
        scores.add_(mask)
    return torch.matmul(scores.softmax(dim=-1), values)


class Attention(nn.Module):
    """Multi-head self-attention with one or several (per-step) projection sets."""

    def __init__(self, dim: int, heads: int, *, num_weights: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.heads = heads
        self.in_projs = TypedModuleList(nn.Linear(dim, 3 * dim, bias=False) for _ in range(num_weights))
        self.out_projs = TypedModuleList(nn.Linear(dim, dim, bias=False) for _ in range(num_weights))

    def forward(
        self, x: torch.Tensor, cache: KVCache | PagedKVCache, plan: StepPlan, weight_index: int = 0
    ) -> torch.Tensor:
        batch, steps, _ = x.shape
        projected = self.in_projs[weight_index](x)
        qkv = projected.view(batch, steps, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, kv = qkv[0], qkv[1:]
        if plan.rope is not None:
            q, kv = fused.apply_rope(q, kv, *plan.rope)
        out = ring_attention(q, kv, cache, plan)
        out = out.transpose(1, 2).reshape(batch, steps, self.dim)
        projected_out: torch.Tensor = self.out_projs[weight_index](out)
        return projected_out


@dataclass(frozen=True)
class CrossKeys:
    """One layer's cross-attention keys and values: each row's own (``[B, H, S, D]``) and,
    optionally, positions every row holds alike, kept once (``[H, S', D]``), which rows attend
    to after their own (docs/engines.md#shared-cross-positions)."""

    keys: torch.Tensor
    values: torch.Tensor
    shared_keys: torch.Tensor | None = None
    shared_values: torch.Tensor | None = None


class CrossAttention(nn.Module):
    """Attention of every query on a row's fixed conditioning (Kyutai TTS voices): keys and
    values are projected once per row (``project``) and kept by the ``Transformer``; no mask
    (the reference attends to every conditioning position, padding included)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.dim = dim
        self.heads = heads
        self.in_projs = TypedModuleList([nn.Linear(dim, 3 * dim, bias=False)])
        self.out_projs = TypedModuleList([nn.Linear(dim, dim, bias=False)])

    def project(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, S, dim]`` conditioning -> keys and values ``[B, H, S, D]``."""
        batch, length, _ = source.shape
        kv = F.linear(source, self.in_projs[0].weight[self.dim :])
        keys, values = kv.view(batch, length, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        return keys, values

    def forward(self, x: torch.Tensor, cross: CrossKeys) -> torch.Tensor:
        batch, steps, _ = x.shape
        q = F.linear(x, self.in_projs[0].weight[: self.dim]).view(batch, steps, self.heads, -1).transpose(1, 2)
        if cross.shared_keys is None or cross.shared_values is None:
            out = F.scaled_dot_product_attention(q, cross.keys, cross.values, dropout_p=0.0)
        else:
            out = _attend_with_shared(q, cross.keys, cross.values, cross.shared_keys, cross.shared_values)
        projected: torch.Tensor = self.out_projs[0](out.transpose(1, 2).reshape(batch, steps, self.dim))
        return projected


def _attend_with_shared(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, shared_keys: torch.Tensor, shared_values: torch.Tensor
) -> torch.Tensor:
    """Attention over each row's keys followed by the shared ones, one softmax over both: the
    shared positions' scores are one matmul per head for all rows (no copy per row)."""
    own = torch.matmul(q, keys.transpose(-1, -2))  # [B, H, T, S]
    shared = torch.einsum("bhtd,hsd->bhts", q, shared_keys)  # [B, H, T, S']
    scores = torch.cat([own, shared], dim=-1).float() * q.shape[-1] ** -0.5
    weights = torch.softmax(scores, dim=-1).to(q.dtype)
    split = own.shape[-1]
    out: torch.Tensor = torch.matmul(weights[..., :split], values)
    return out + torch.einsum("bhts,hsd->bhtd", weights[..., split:], shared_values)


class LayerScale(nn.Module):
    """The learned per-channel scale of a residual branch (applied by ``fused.scaled_residual``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))


class TransformerLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``.

    ``num_weights > 1`` gives the depformer's per-step weights: step ``i`` of a frame uses
    projection set ``schedule[i]``. ``cross_attention`` adds ``x + cross(norm_cross(x))``
    between the two (a LayerNorm whatever ``norm`` says, as the reference has it).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dim_feedforward: int,
        *,
        norm: str,
        gating: bool,
        layer_scale: bool,
        num_weights: int,
        cross_attention: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads, num_weights=num_weights)
        self.cross_attention = CrossAttention(dim, heads) if cross_attention else None
        self.norm_cross = nn.LayerNorm(dim, eps=1e-5) if cross_attention else None
        self.norm1 = make_norm(norm, dim)
        self.norm2 = make_norm(norm, dim)
        self.mlp: nn.ModuleList = nn.ModuleList(
            (GatedMLP(dim, dim_feedforward) if gating else GeluMLP(dim, dim_feedforward)) for _ in range(num_weights)
        )
        self.layer_scale_1: nn.Module = LayerScale(dim) if layer_scale else nn.Identity()
        self.layer_scale_2: nn.Module = LayerScale(dim) if layer_scale else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        normed: torch.Tensor,
        cache: KVCache | PagedKVCache,
        plan: StepPlan,
        weight_index: int = 0,
        cross: CrossKeys | None = None,
        next_norm: nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``normed`` is ``norm1(x)``, computed with the previous layer's last residual. Returns
        the layer's output and ``next_norm`` of it (None without one)."""
        update = self.self_attn(normed, cache, plan, weight_index)
        if self.cross_attention is not None and self.norm_cross is not None:
            assert cross is not None, "a cross-attention layer needs its rows' keys and values"
            x = _residual(x, update, self.layer_scale_1)
            x = x + self.cross_attention(self.norm_cross(x), cross)
            normed = self.norm2(x)
        else:
            x, normed = _residual_and_norm(x, update, self.layer_scale_1, self.norm2)
        update = self.mlp[weight_index](normed)
        if next_norm is None:
            return _residual(x, update, self.layer_scale_2), None
        return _residual_and_norm(x, update, self.layer_scale_2, next_norm)


def _residual(x: torch.Tensor, update: torch.Tensor, scale: nn.Module) -> torch.Tensor:
    if isinstance(scale, LayerScale):
        return fused.scaled_residual(x, update, scale.scale)
    return x.to(update) + update


def _residual_and_norm(
    x: torch.Tensor, update: torch.Tensor, scale: nn.Module, norm: nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual sum and ``norm`` of it: one fused kernel for an RMSNorm."""
    if isinstance(norm, RMSNorm):
        factor = scale.scale if isinstance(scale, LayerScale) else None
        return fused.residual_rms_norm(x, update, factor, norm.alpha, norm.eps)
    x = _residual(x, update, scale)
    return x, norm(x)


class Transformer(nn.Module):
    """A stack of ``TransformerLayer`` with its streaming state: per-layer ring caches and
    one position per row.

    ``context`` is the attention window and ``capacity`` the ring length; ``span`` (None:
    the whole ring) bounds the ring slots attention reads, and whoever sets it guarantees no
    row's position has reached it (``FrameStep`` tracks positions on the host).

    ``use_paged_kv(spec)`` swaps the per-row bf16 rings for paged int8 pools (``paged_kv``)
    from the next ``start``: the ring becomes ``width`` blocks, and ``blocks`` (the host
    allocator) must give a row the block of each position before the step that writes it.

    ``cross_attention`` layers attend to a per-row conditioning whose keys and values
    (``cross``, one ``CrossKeys`` per layer, ``[B, H, S, D]``) are allocated by ``start_cross``
    and written row by row by ``set_cross_rows``; ``set_cross_shared`` adds positions that every
    row holds alike, kept once.

    ``shared_positions`` (the depformer's ``dep_q``): every row restarts at position 0 together
    (``restart``) and then advances one position per call, up to that many, so the position is
    known on the host and the plans of those positions are built once at ``start`` instead of
    on every call.
    A plan is ~30 small kernels (positions, mask, write slots): for a TTS depformer of 32
    codebooks, ~900 of a frame's ~4,300 kernels; and each row's new keys are one copy into
    one ring slot instead of a scatter through a ``[B, H, 1, D]`` index.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        layers: int,
        dim_feedforward: int,
        *,
        norm: str,
        gating: bool,
        layer_scale: bool,
        num_weights: int = 1,
        rope_max_period: float | None,
        context: int | None,
        capacity: int,
        cross_attention: bool = False,
        shared_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.heads = heads
        self.capacity = capacity
        self.context = context
        self.rope_max_period = rope_max_period
        self.layers = TypedModuleList(
            TransformerLayer(
                dim,
                heads,
                dim_feedforward,
                norm=norm,
                gating=gating,
                layer_scale=layer_scale,
                num_weights=num_weights,
                cross_attention=cross_attention,
            )
            for _ in range(layers)
        )
        self.cross: list[CrossKeys] = []
        self.caches: list[KVCache] | list[PagedKVCache] = []
        self.offset = torch.zeros(0, dtype=torch.long)
        self.span: int | None = None
        self.paged: PagedKVSpec | None = None
        self.floor: torch.Tensor | None = None
        self.blocks: BlockAllocator | None = None
        self.shared_positions = shared_positions
        self._shared_plans: list[StepPlan] = []  # by position, with shared_positions
        self._position = 0  # every row's position, with shared_positions

    def use_paged_kv(self, spec: PagedKVSpec | None) -> None:
        """Paged int8 KV from the next ``start`` (None: back to bf16 rings of ``context`` frames)."""
        if self.context is None:
            raise ValueError("paged KV needs an attention window (context)")
        self.paged = spec
        self.capacity = self.context if spec is None else spec.width(self.context) * spec.block_size

    def start(self, batch: int, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate the streaming state for ``batch`` rows, all fresh."""
        head_dim = self.dim // self.heads
        self.caches, self.floor, self.blocks = [], None, None  # free the old pools before allocating new ones
        self.offset = torch.zeros(batch, dtype=torch.long, device=device)
        self._shared_plans, self._position = [], 0
        if self.shared_positions is not None:
            if self.paged is not None:
                raise ValueError("rows in step keep their keys in rings, not paged KV")
            self._shared_plans = [self._shared_plan(p, batch, device) for p in range(self.shared_positions)]
        if self.paged is None:
            self.caches = [
                KVCache.empty(batch, self.heads, self.capacity, head_dim, device, dtype) for _ in self.layers
            ]
            return
        width = self.capacity // self.paged.block_size
        table = torch.zeros(batch, width, dtype=torch.int32, device=device)
        self.floor = torch.zeros(batch, dtype=torch.long, device=device)
        self.caches = [PagedKVCache.empty(self.paged, self.heads, head_dim, table) for _ in self.layers]
        self.blocks = BlockAllocator(self.paged, batch, width, table, self.floor)

    def restart(self) -> None:
        """Every row back to position 0 (the depformer, at each frame). With shared positions the
        position lives on the host only: ``offset`` is not read, so it is not zeroed (a kernel a frame)."""
        if self.shared_positions is None:
            self.offset.zero_()
        self._position = 0

    def reset_rows(self, mask: torch.Tensor) -> None:
        if mask.is_cuda and torch.cuda.is_current_stream_capturing():
            # Inside a captured step (Mimi decoder rows whose first frame is not out yet): no sync.
            for cache in self.caches:
                cache.reset_rows(mask)
        else:  # a slot opening (or a CPU step): only its rows' memory, one sync for the indices
            rows = mask.nonzero().flatten()
            for cache in self.caches:
                cache.clear(rows)
        self.offset.masked_fill_(mask, 0)

    def narrow_rows(self, rows: int) -> None:
        """On a copy (``row_views.first_rows``): its rings, positions and cross-attention become
        views of the first ``rows`` rows; the shared positions' plans are built for as many."""
        if self.paged is not None:
            raise ValueError("paged KV is not narrowed to its first rows (its blocks are handed out per row)")
        self.offset = self.offset[:rows]
        self.caches = [KVCache(cache.pair[:, :rows]) for cache in self.caches if isinstance(cache, KVCache)]
        self.cross = [replace(cross, keys=cross.keys[:rows], values=cross.values[:rows]) for cross in self.cross]
        if self.shared_positions is not None:
            device = self.offset.device
            self._shared_plans = [self._shared_plan(p, rows, device) for p in range(self.shared_positions)]

    def take_rows(
        self, rows: torch.Tensor, source: Transformer, source_rows: torch.Tensor, positions: int | None = None
    ) -> None:
        """Rows ``rows`` continue ``source``'s ``source_rows`` (``[N]`` indices): their keys and
        values, offsets and cross-attention. Both keep rings; ``positions``: the rows are at most
        that many steps in, so only the rings' first ``positions`` slots hold entries (None: all)."""
        for cache, theirs in zip(self.caches, source.caches, strict=True):
            if not isinstance(cache, KVCache) or not isinstance(theirs, KVCache):
                raise ValueError("rows move between ring caches only")
            cache.pair[:, rows, :, :positions] = theirs.pair[:, source_rows, :, :positions]
        self.offset[rows] = source.offset[source_rows]
        for cross, theirs in zip(self.cross, source.cross, strict=True):
            cross.keys[rows] = theirs.keys[source_rows]
            cross.values[rows] = theirs.values[source_rows]

    def start_cross(self, batch: int, length: int, device: torch.device, dtype: torch.dtype) -> None:
        """Zeroed cross-attention keys and values for ``batch`` rows of ``length`` positions."""
        shape = (batch, self.heads, length, self.dim // self.heads)
        self.cross = [
            CrossKeys(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in self.layers
        ]

    def set_cross_rows(self, rows: torch.Tensor, source: torch.Tensor) -> None:
        """Rows ``rows`` (``[N]`` indices) attend to ``source`` (``[N, S, dim]``, or ``[1, S, dim]``
        for all of them, projected once) from now on (in place)."""
        for layer, cross in zip(self.layers, self.cross):
            assert layer.cross_attention is not None
            new_keys, new_values = layer.cross_attention.project(source.to(cross.keys.dtype))
            cross.keys.index_copy_(0, rows, new_keys.expand(len(rows), -1, -1, -1))
            cross.values.index_copy_(0, rows, new_values.expand(len(rows), -1, -1, -1))

    @torch.no_grad()
    def set_cross_shared(self, source: torch.Tensor) -> None:
        """Every row attends to ``source`` (``[1, S', dim]``) after its own positions, from the
        next step (after ``start_cross``; a captured step keeps the tensors it saw)."""
        shared = []
        for layer, cross in zip(self.layers, self.cross):
            assert layer.cross_attention is not None
            keys, values = layer.cross_attention.project(source.to(cross.keys.dtype))
            shared.append(replace(cross, shared_keys=keys[0].contiguous(), shared_values=values[0].contiguous()))
        self.cross = shared

    def _plan(self, offset: torch.Tensor, steps: int, span: int | None) -> StepPlan:
        return StepPlan.build(
            offset,
            steps,
            self.heads,
            self.dim // self.heads,
            self.capacity,
            self.context,
            span,
            self.rope_max_period,
            self.floor,
            dtype=self.layers[0].self_attn.in_projs[0].weight.dtype,
        )

    def _shared_plan(self, position: int, batch: int, device: torch.device) -> StepPlan:
        """The plan of one step at ``position`` for every row; attention reads only the ring
        slots written since the restart until the ring wraps."""
        offset = torch.full((batch,), position, dtype=torch.long, device=device)
        span = position + 1 if position < self.capacity else None
        plan = self._plan(offset, 1, span)
        # Until the ring wraps, inside the attention window, every slot of the span was written
        # since the restart: no mask. SDPA then runs its fused kernel as it is, where a mask whose
        # length is not a multiple of its alignment is padded into a new tensor in every layer.
        sees_span = span is not None and (self.context is None or position < self.context)
        return replace(plan, shared_slot=position % self.capacity, mask=None if sees_span else plan.mask)

    def forward(self, x: torch.Tensor, weight_index: int = 0) -> torch.Tensor:
        """Advance every row by ``x.shape[1]`` steps."""
        dtype_in = x.dtype
        steps = x.shape[1]
        if self.shared_positions is None:
            plan = self._plan(self.offset, steps, self.span)
        elif steps == 1 and self._position < self.shared_positions:
            plan = self._shared_plans[self._position]
        else:
            raise ValueError(f"rows in step take one position per call, at most {self.shared_positions} per restart")
        normed: torch.Tensor | None = self.layers[0].norm1(x)
        for index, (layer, cache) in enumerate(zip(self.layers, self.caches)):
            assert normed is not None
            following = self.layers[index + 1].norm1 if index + 1 < len(self.layers) else None
            cross = self.cross[index] if self.cross else None
            x, normed = layer(x, normed, cache, plan, weight_index, cross, following)
        if self.shared_positions is None:
            self.offset.add_(steps)
        else:
            self._position += 1
        return x.to(dtype_in)
