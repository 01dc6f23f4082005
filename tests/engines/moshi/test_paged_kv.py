"""Paged 8-bit and 4-bit KV for the temporal transformer: a conversation holds blocks for the
frames it has reached (no preallocated ring), admission refuses with a typed error when the pool
is empty, a full pool shrinks a growing row's context instead of crashing, greedy decoding with
8-bit KV agrees with float rings, 4-bit attention stays near them in half the bytes, and the
Triton kernels (compiled on CUDA; on the CPU run by Triton's interpreter) store and read the
blocks as the torch path does."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from rtserve.config import KvCacheSection
from rtserve.engines.errors import CapacityExhausted
from rtserve.engines.moshi.frame_step import FrameStep
from rtserve.engines.moshi.layers import StepPlan, Transformer
from rtserve.engines.moshi.loader import LoadedModel, load_folder
from rtserve.engines.moshi.paged_kv import (
    KVMemoryExhausted,
    PagedKVCache,
    PagedKVSpec,
    pack_nibbles,
    paged_kv_spec,
    unpack_nibbles,
)
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from tests.engines.moshi.tiny import TinyCheckpoint
from tests.engines.moshi.triton_support import kernel_module

CPU = torch.device("cpu")


def _transformer(spec: PagedKVSpec | None, batch: int, context: int = 40) -> Transformer:
    torch.manual_seed(0)
    t = Transformer(
        64,
        4,
        2,
        256,
        norm="rms_norm_f32",
        gating=True,
        layer_scale=False,
        rope_max_period=10000,
        context=context,
        capacity=context,
    )
    if spec is not None:
        t.use_paged_kv(spec)
    t.start(batch, CPU, torch.float32)
    return t


def _step(t: Transformer, x: torch.Tensor, positions: np.ndarray) -> torch.Tensor:
    if t.blocks is not None:
        t.blocks.ensure(np.arange(len(positions)), positions)
        t.blocks.sync()
    out = t(x)
    positions += 1
    return out


@torch.no_grad()
def test_a_conversation_holds_blocks_only_for_the_frames_it_has_reached() -> None:
    t = _transformer(PagedKVSpec(num_blocks=40, block_size=8), batch=2)
    assert t.blocks is not None and t.blocks.width == 5
    positions = np.zeros(2, np.int64)
    t.blocks.admit(0)
    held = []
    for _ in range(60):
        _step(t, torch.randn(2, 1, 64), positions)
        held.append(t.blocks.held(0))
    assert held[0] == 1 and held[8] == 2 and held[23] == 3  # one 8-frame block per 8 frames reached
    assert max(held) == 5  # then the window (40 frames) reuses its own blocks
    t.blocks.release(0)
    t.blocks.release(1)
    assert t.blocks.free_blocks == 40


def test_admission_without_a_free_block_is_refused_with_a_typed_error() -> None:
    t = _transformer(PagedKVSpec(num_blocks=1, block_size=8), batch=2)
    assert t.blocks is not None
    t.blocks.admit(0)
    with pytest.raises(KVMemoryExhausted) as caught:
        t.blocks.admit(1)
    assert isinstance(caught.value, CapacityExhausted) and caught.value.code == CapacityExhausted.code
    t.blocks.release(0)
    t.blocks.admit(1)  # freed blocks are admitted again


@torch.no_grad()
def test_a_full_pool_shrinks_the_growing_rows_context_instead_of_failing() -> None:
    t = _transformer(PagedKVSpec(num_blocks=4, block_size=8), batch=2)
    assert t.blocks is not None and t.floor is not None
    positions = np.zeros(2, np.int64)
    t.blocks.admit(0)
    t.blocks.admit(1)
    for _ in range(40):
        out = _step(t, torch.randn(2, 1, 64), positions)
        assert torch.isfinite(out).all()
    assert t.blocks.held(0) + t.blocks.held(1) == 4 and t.blocks.free_blocks == 0
    assert t.floor.min() > 0  # both rows now read only their newest frames


def _attention_errors(bits: int) -> list[float]:
    """Relative distance of paged attention (``bits``) from float rings at each of 90 steps."""
    torch.manual_seed(1)
    ring = _transformer(None, batch=3)
    paged = _transformer(PagedKVSpec(num_blocks=30, block_size=8, bits=bits), batch=3)
    positions = np.zeros(3, np.int64)
    errors = []
    for step in range(90):  # past the 40-frame window twice; row 2 restarts midway
        if step == 50:
            mask = torch.tensor([False, False, True])
            ring.reset_rows(mask)
            paged.reset_rows(mask)
            assert paged.blocks is not None
            paged.blocks.admit(2)
            positions[2] = 0
        x = torch.randn(3, 1, 64)
        a, b = ring(x), _step(paged, x, positions)
        errors.append(float((a - b).norm() / a.norm()))
    return errors


@torch.no_grad()
def test_paged_int8_attention_tracks_float_rings_across_wrap_and_mixed_positions() -> None:
    assert max(_attention_errors(8)) < 1e-2


@torch.no_grad()
def test_paged_int4_attention_stays_near_float_rings_in_half_the_bytes() -> None:
    """4 bits: worse than 8 (~20x the error; the store really is 4-bit) but bounded: median ~1 %,
    the worst step ~3 % on this model (the bound leaves 2x)."""
    int8, int4 = np.median(_attention_errors(8)), _attention_errors(4)
    assert max(int4) < 6e-2 and np.median(int4) > 5 * int8
    spec = PagedKVSpec(num_blocks=2, block_size=8, bits=4)
    cache = PagedKVCache.empty(spec, 4, 16, torch.zeros(1, 2, dtype=torch.int32))
    assert cache.keys.shape[-1] == 8 and PagedKVSpec.bytes_per_frame(1, 4, 16, 4) == 4 * 2 * (8 + 4)


def test_nibble_packing_round_trips_every_4_bit_value_pair() -> None:
    values = torch.arange(-8, 8, dtype=torch.int8)
    low, high = torch.meshgrid(values, values, indexing="ij")
    q = torch.cat((low.reshape(-1, 1), high.reshape(-1, 1)), dim=1)  # every (element 0, element 1) pair
    packed = pack_nibbles(q)
    assert packed.shape == (256, 1) and packed.dtype == torch.int8 and len(set(packed.flatten().tolist())) == 256
    assert torch.equal(unpack_nibbles(packed), q.int())


def test_the_kv_cache_setting_picks_the_stores_width() -> None:
    assert paged_kv_spec(KvCacheSection(kv_cache="ring"), 4, 100) is None
    for setting, bits in (("paged_int8", 8), ("paged_int4", 4)):
        spec = paged_kv_spec(KvCacheSection(kv_cache=setting, kv_block_frames=16), 4, 100)
        assert spec is not None and spec.bits == bits and spec.num_blocks == 25


def _greedy_tokens(model: LoadedModel, spec: PagedKVSpec | None, inputs: torch.Tensor) -> np.ndarray:
    t = model.lm.transformer
    t.use_paged_kv(spec)
    try:
        frame = FrameStep(model.lm, model.mimi, SlotSampler(inputs.shape[1], CPU, MoshiSampling()), inputs.shape[1])
        return np.stack([frame(pcm).tokens.numpy().copy() for pcm in inputs])
    finally:
        t.use_paged_kv(None)


@torch.no_grad()
def test_greedy_tokens_with_8_bit_kv_stay_as_close_to_fp32_as_bf16_rings_do_over_200_frames(
    tiny: TinyCheckpoint, loaded: LoadedModel
) -> None:
    """Free-running greedy decoding of a tiny random model is chaotic (near-tied logits; one flip
    changes every later input), so the bar is the precision the GPU engine already runs at:
    int8 paged KV must agree with fp32 rings at least as often as bf16 weights and rings do."""
    gen = torch.Generator().manual_seed(7)
    inputs = 0.3 * torch.randn(200, 2, loaded.mimi.frame_size, generator=gen)
    fp32 = _greedy_tokens(loaded, None, inputs)
    int8_paged = _greedy_tokens(loaded, PagedKVSpec(num_blocks=20, block_size=8), inputs)
    bf16 = _greedy_tokens(load_folder(tiny.folder, device=CPU, dtype=torch.bfloat16), None, inputs)
    int8_agree = (fp32 == int8_paged).all(-1).mean()
    bf16_agree = (fp32 == bf16).all(-1).mean()
    assert int8_agree >= bf16_agree, f"int8 {int8_agree:.1%} vs bf16 {bf16_agree:.1%} identical token frames"


@pytest.fixture
def kernels() -> tuple[ModuleType, torch.device]:
    """``paged_attention`` and the device its Triton kernels run on (``kernel_module``)."""
    return kernel_module("rtserve.engines.moshi.paged_attention")


@pytest.mark.parametrize("bits", [8, 4])
def test_the_triton_kernel_reads_the_blocks_as_the_reference_path_does(
    kernels: tuple[ModuleType, torch.device], bits: int
) -> None:
    attention, device = kernels
    batch, heads, dim, size, context = 5, 4, 128, 64, 300
    spec = PagedKVSpec(num_blocks=40, block_size=size, bits=bits)
    width = spec.width(context)
    capacity = width * size
    table = torch.randperm(spec.num_blocks, device=device)[: batch * width].view(batch, width).int() + 1
    cache = PagedKVCache.empty(spec, heads, dim, table)
    for pool in (cache.keys, cache.values):
        pool.random_(-128, 128)  # any byte: 127 values, or two nibbles
    for scales in (cache.key_scales, cache.value_scales):
        scales.uniform_(0.001, 0.05)
    offset = torch.tensor([0, 63, 64, 299, 700], device=device)  # fresh, block edges, full, wrapped
    floor = torch.tensor([0, 0, 10, 0, 500], device=device)
    q = torch.randn(batch, heads, 1, dim, device=device, dtype=torch.bfloat16)
    plan = StepPlan.build(offset, 1, heads, dim, capacity, context, capacity, None, floor)
    keys, values = cache.gather(capacity, torch.float32)
    want = F.scaled_dot_product_attention(q.float(), keys, values, plan.mask)
    got = attention.paged_decode(q, cache, offset, floor, capacity, capacity, context).float()
    assert float((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX runs only on a CUDA device")
@pytest.mark.parametrize("bits", [8, 4])
def test_the_byte_permute_reads_the_same_floats_as_the_conversion_instruction(bits: int) -> None:
    # Both turn every stored byte (or nibble) into the exact float, so the outputs agree to the
    # last bf16 bit (the compiler may order the sums differently); a lane out of order or a
    # wrong bias would not.
    from rtserve.engines.moshi.paged_attention import paged_decode

    device = torch.device("cuda")
    batch, heads, dim, size, context = 6, 4, 128, 64, 640
    spec = PagedKVSpec(num_blocks=batch * 10 + 1, block_size=size, bits=bits)
    width = spec.width(context)
    table = torch.randperm(spec.num_blocks - 1, device=device)[: batch * width].view(batch, width).int() + 1
    cache = PagedKVCache.empty(spec, heads, dim, table)
    for pool in (cache.keys, cache.values):
        pool.random_(-128, 128)  # any byte: a value, or two nibbles
    for scales in (cache.key_scales, cache.value_scales):
        scales.uniform_(0.001, 0.05)
    offset = torch.tensor([0, 63, 64, 300, 639, 1000], device=device)
    floor = torch.zeros(batch, dtype=torch.long, device=device)
    q = torch.randn(batch, heads, 1, dim, device=device, dtype=torch.bfloat16)
    capacity = width * size
    permuted, converted = (
        paged_decode(q, cache, offset, floor, capacity, capacity, context, byte_permute=flag) for flag in (True, False)
    )
    torch.testing.assert_close(permuted.float(), converted.float(), rtol=2**-7, atol=1e-5)
    assert float(permuted.float().abs().sum()) > 0


@pytest.mark.parametrize("bits", [8, 4])
def test_the_triton_write_stores_what_the_reference_quantizer_does(
    kernels: tuple[ModuleType, torch.device], bits: int
) -> None:
    attention, device = kernels
    batch, heads, dim, size, width = 4, 4, 128, 64, 5
    spec = PagedKVSpec(num_blocks=batch * width, block_size=size, bits=bits)
    table = torch.randperm(batch * width, device=device).view(batch, width).int() + 1
    want, got = PagedKVCache.empty(spec, heads, dim, table), PagedKVCache.empty(spec, heads, dim, table)
    offset = torch.tensor([0, 63, 64, 700], device=device)
    _, k, v = (3 * torch.randn(batch, 1, 3, heads, dim, device=device, dtype=torch.bfloat16)).permute(2, 0, 3, 1, 4)
    k = k.contiguous()  # as RoPE leaves keys; values stay a strided view of the projection
    want.write(k, v, (offset % (width * size)).view(-1, 1))
    attention.paged_write(k, v, got, offset, width * size)
    stored = (lambda pool: pool.int()) if bits == 8 else unpack_nibbles
    for a, b in ((want.keys, got.keys), (want.values, got.values)):
        assert int(stored(a).abs().sum()) > 0
        assert int((stored(a) - stored(b)).abs().max()) <= 1  # rounding of exact halves may differ
    torch.testing.assert_close(got.key_scales, want.key_scales)
    torch.testing.assert_close(got.value_scales, want.value_scales)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_paged_steps_give_the_eager_paged_tokens(tiny: TinyCheckpoint) -> None:
    model = load_folder(tiny.folder, device=torch.device("cuda"), dtype=torch.bfloat16)
    inputs = 0.3 * torch.randn(60, 2, model.mimi.frame_size, device="cuda")
    runs = []
    for graph in (False, True):
        model.lm.transformer.use_paged_kv(PagedKVSpec(num_blocks=20, block_size=8))
        frame = FrameStep(
            model.lm, model.mimi, SlotSampler(2, inputs.device, MoshiSampling()), 2, graph=graph, span_bucket=16
        )
        runs.append(np.stack([frame(pcm).tokens.cpu().numpy() for pcm in inputs]))
    assert np.array_equal(runs[0], runs[1])
