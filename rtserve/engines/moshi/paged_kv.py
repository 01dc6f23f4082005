"""Paged 8-bit or 4-bit KV for the temporal transformer (issue 20, issue 35): memory that grows
with each conversation instead of a preallocated ring per slot.

Every layer owns one pool of ``num_blocks`` blocks of ``block_size`` frames, keys and values
quantized symmetrically per (frame, head) with one fp32 scale (``amax / 127`` in 8 bits,
``amax / 7`` in 4). A 4-bit vector of ``D`` values is ``D / 2`` bytes: byte ``d`` holds element
``d`` in its low nibble and element ``d + D / 2`` in its high one, so both halves unpack with
whole-row loads (docs/engines.md#paged-int8-kv). A slot's ring of
``capacity = width * block_size`` frames is a row of the block table shared by all layers:
ring slot ``s`` lives in block ``table[row, s // block_size]`` at ``s % block_size``. Block 0
is scratch: a table entry of 0 means "no block", and rows without a block (idle slots) write
there and read garbage nobody uses. Shapes never change, so CUDA graphs stay valid; the host
``BlockAllocator`` hands blocks out as positions advance and takes them back on release.

When the pool is empty a growing row recycles its own oldest block and raises its ``floor``
(the first position attention may read): its context shrinks, nothing crashes. Admission
(``BlockAllocator.admit``) refuses a new conversation with ``KVMemoryExhausted`` unless a
block is free.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional as F

from rtserve.config import KvCacheSection
from rtserve.engines.errors import CapacityExhausted

log = logging.getLogger(__name__)

SCRATCH = 0  # block id of the shared scratch block


class KVMemoryExhausted(CapacityExhausted):
    """No KV block is free for a new conversation; the caller refuses the session."""


@dataclass(frozen=True)
class PagedKVSpec:
    """``num_blocks`` usable blocks per layer (one scratch block is added), ``block_size`` frames each."""

    num_blocks: int
    block_size: int = 64
    bits: int = 8  # 8 or 4 per key / value element

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError("paged KV needs at least one block")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.bits not in (4, 8):
            raise ValueError(f"paged KV stores 8 or 4 bits per value, not {self.bits}")

    def width(self, context: int) -> int:
        """Table entries per row: enough blocks for ``context`` frames."""
        return math.ceil(context / self.block_size)

    @staticmethod
    def bytes_per_frame(layers: int, heads: int, head_dim: int, bits: int = 8) -> int:
        """Device bytes one frame of one conversation takes (K and V plus their fp32 scales)."""
        return layers * 2 * heads * (head_dim * bits // 8 + 4)


BITS = {"paged_int8": 8, "paged_int4": 4}


def paged_kv_spec(settings: KvCacheSection, batch_size: int, context: int) -> PagedKVSpec | None:
    """The pool a ``kv_cache`` setting asks for, ``None`` for rings (docs/engines.md#paged-int8-kv)."""
    if settings.kv_cache == "ring":
        return None
    frames = settings.kv_pool_frames or batch_size * context
    return PagedKVSpec(
        num_blocks=-(-frames // settings.kv_block_frames),
        block_size=settings.kv_block_frames,
        bits=BITS[settings.kv_cache],
    )


def qmax(bits: int) -> float:
    """The largest stored integer of a ``bits``-wide symmetric store (127 in 8 bits, 7 in 4)."""
    return float(2 ** (bits - 1) - 1)


def quantize(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., D]`` -> integer values in ``[-qmax, qmax]`` (int8, unpacked) and fp32 scales ``[...]``
    (symmetric per vector; never NaN)."""
    top = qmax(bits)
    x32 = x.float()
    scale = torch.nan_to_num(x32.abs().amax(-1) / top, nan=0.0, posinf=0.0)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.nan_to_num(x32 / safe[..., None], nan=0.0).round().clamp(-top, top).to(torch.int8)
    return q, scale


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] ``[..., D]`` -> ``[..., D / 2]`` bytes: element ``d`` in the low
    nibble of byte ``d``, element ``d + D / 2`` in its high nibble."""
    low, high = q.int().chunk(2, dim=-1)
    byte = (low & 15) | ((high & 15) << 4)
    return torch.where(byte > 127, byte - 256, byte).to(torch.int8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``pack_nibbles`` undone: ``[..., D / 2]`` bytes -> int32 values ``[..., D]``."""
    byte = packed.int()
    return torch.cat((((byte & 15) ^ 8) - 8, byte >> 4), dim=-1)


@dataclass
class PagedKVCache:
    """One layer's pools: ``keys``/``values`` int8 ``[N, H, block, D * bits / 8]``, scales fp32
    ``[N, H, block]``; ``table`` (shared by all layers) ``[B, width]`` int32."""

    keys: torch.Tensor
    values: torch.Tensor
    key_scales: torch.Tensor
    value_scales: torch.Tensor
    table: torch.Tensor
    bits: int = 8

    @classmethod
    def empty(cls, spec: PagedKVSpec, heads: int, head_dim: int, table: torch.Tensor) -> PagedKVCache:
        if spec.bits == 4 and head_dim % 2:
            raise ValueError(f"4-bit paged KV packs value pairs: head_dim {head_dim} is odd")
        device = table.device
        shape = (spec.num_blocks + 1, heads, spec.block_size, head_dim * spec.bits // 8)
        return cls(
            torch.zeros(shape, dtype=torch.int8, device=device),
            torch.zeros(shape, dtype=torch.int8, device=device),
            torch.zeros(shape[:3], dtype=torch.float32, device=device),
            torch.zeros(shape[:3], dtype=torch.float32, device=device),
            table,
            spec.bits,
        )

    @property
    def block_size(self) -> int:
        return self.keys.shape[2]

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Nothing to clear: a fresh row's positions start at 0 and attention never reads past them."""

    def clear(self, rows: torch.Tensor) -> None:
        """Nothing to clear (as ``reset_rows``)."""

    def write(self, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor) -> None:
        """Quantize ``[B, H, T, D]`` keys/values into ring slots ``slot`` ``[B, T]``."""
        block = self.table.gather(1, torch.div(slot, self.block_size, rounding_mode="floor")).long()
        within = slot % self.block_size
        for pool, scales, x in ((self.keys, self.key_scales, k), (self.values, self.value_scales, v)):
            q, scale = quantize(x.transpose(1, 2), self.bits)  # [B, T, H, D], [B, T, H]
            pool[block, :, within] = q if self.bits == 8 else pack_nibbles(q)
            scales[block, :, within] = scale

    def gather(self, span: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized ``[B, H, span, D]`` keys and values of the first ``span`` ring slots."""
        blocks = self.table[:, : -(-span // self.block_size)].long()  # [B, nb]

        def one(pool: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
            stored = pool[blocks] if self.bits == 8 else unpack_nibbles(pool[blocks])
            x = stored.float() * scales[blocks][..., None]  # [B, nb, H, block, D]
            batch, nb, heads, size, dim = x.shape
            return x.permute(0, 2, 1, 3, 4).reshape(batch, heads, nb * size, dim)[:, :, :span].to(dtype)

        return one(self.keys, self.key_scales), one(self.values, self.value_scales)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slot: torch.Tensor,
        offset: torch.Tensor,
        floor: torch.Tensor,
        mask: torch.Tensor,
        span: int,
        capacity: int,
        context: int | None,
    ) -> torch.Tensor:
        """Write then attend; on CUDA a single step is two Triton kernels (quantize-and-store, then
        attention reading the quantized blocks directly)."""
        if q.is_cuda and q.shape[2] == 1:
            from rtserve.engines.moshi.paged_attention import paged_decode, paged_write

            paged_write(k, v, self, offset, capacity)
            return paged_decode(q, self, offset, floor, span, capacity, context)
        self.write(k, v, slot)
        keys, values = self.gather(span, q.dtype)
        return F.scaled_dot_product_attention(q, keys, values, mask, dropout_p=0.0)


class BlockAllocator:
    """Host side of the block tables: a free list, each row's table and floor, mirrored to the
    device tensors ``table`` and ``floor`` before each step (only when something changed)."""

    def __init__(self, spec: PagedKVSpec, batch: int, width: int, table: torch.Tensor, floor: torch.Tensor) -> None:
        self.spec = spec
        self.width = width
        self.table = np.zeros((batch, width), np.int32)
        self.floor = np.zeros(batch, np.int64)
        self.free = list(range(spec.num_blocks, 0, -1))  # pop() hands out low ids first
        self.device_table = table
        self.device_floor = floor
        self.dirty = False

    @property
    def free_blocks(self) -> int:
        return len(self.free)

    def held(self, row: int) -> int:
        return int(np.count_nonzero(self.table[row]))

    def release(self, row: int) -> None:
        """Give all of ``row``'s blocks back; the row reads nothing until it is admitted again."""
        ids = self.table[row][self.table[row] != SCRATCH]
        self.free.extend(int(i) for i in ids)
        self.table[row] = SCRATCH
        self.floor[row] = 0
        self.dirty = True

    def admit(self, row: int) -> None:
        """Start ``row`` as a fresh conversation holding its first block, or raise ``KVMemoryExhausted``."""
        self.release(row)
        if not self.free:
            raise KVMemoryExhausted(f"no KV block free ({self.spec.num_blocks} blocks all in use)")
        self.table[row, 0] = self.free.pop()

    def advance(self, row: int, position: int) -> None:
        """Benchmarking (``FrameStep.advance``): ``row`` holds the blocks its window reaches at
        ``position`` frames, as if it had stepped that far; ``KVMemoryExhausted`` (and no blocks
        held) when the pool has too few."""
        last = position // self.spec.block_size
        entries = [(last - k) % self.width for k in range(min(self.width, last + 1))]
        self.release(row)
        if len(entries) > len(self.free):
            raise KVMemoryExhausted(f"no room for a {position}-frame context ({len(self.free)} KV blocks free)")
        for entry in entries:
            self.table[row, entry] = self.free.pop()

    def ensure(self, rows: npt.NDArray[np.intp], positions: npt.NDArray[np.int64]) -> None:
        """Give each of ``rows`` the block its next position (``positions[row]``) writes to."""
        entries = positions[rows] // self.spec.block_size % self.width
        # Vectorised: a row needs a block once every block_size frames, so most ticks none does.
        needy = self.table[rows, entries] == SCRATCH
        for row, position, entry in zip(
            rows[needy].tolist(), positions[rows][needy].tolist(), entries[needy].tolist(), strict=True
        ):
            self.dirty = True
            if self.free:
                self.table[row, entry] = self.free.pop()
            else:
                self._recycle(row, position, entry)

    def _recycle(self, row: int, position: int, entry: int) -> None:
        """Move the row's oldest block to ``entry`` and raise its floor past what that block held."""
        size = self.spec.block_size
        start = max(int(self.floor[row]), position - self.width * size + size) // size * size
        while start < position:
            old = (start // size) % self.width
            if self.table[row, old] != SCRATCH:
                break
            start += size
        old = (start // size) % self.width
        self.table[row, entry] = self.table[row, old]
        if old != entry:
            self.table[row, old] = SCRATCH
        self.floor[row] = start + size if start < position else position
        log.warning("KV pool empty: slot %d keeps only frames >= %d", row, self.floor[row])

    def sync(self) -> None:
        """Copy the host tables to the device (call before the step that reads them)."""
        if self.dirty:
            self.device_table.copy_(torch.from_numpy(self.table))
            self.device_floor.copy_(torch.from_numpy(self.floor))
            self.dirty = False
