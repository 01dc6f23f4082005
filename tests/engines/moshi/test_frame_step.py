"""``FrameStep``: the whole tick as one callable. Attention sized to the real context must
decode exactly what whole-ring attention does, and on a GPU the CUDA-graph replay must give
the eager step's tokens and audio (sampling rows, a recycled slot and span changes included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtserve.engines.moshi.frame_step import FrameStep
from rtserve.engines.moshi.loader import LoadedModel, load_folder
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from tests.engines.moshi.tiny import TinyCheckpoint

# Past the tiny model's 40-frame ring, so spans grow, then the ring wraps.
FRAMES = 50
RECYCLE_AT = 30


def _run(
    model: LoadedModel, inputs: torch.Tensor, *, span_bucket: int, graph: bool = False
) -> list[tuple[np.ndarray, np.ndarray]]:
    device = inputs.device
    sampler = SlotSampler(3, device, MoshiSampling())
    sampler.configure(1, MoshiSampling(use_sampling=True, temperature=1.0, temperature_text=1.0), seed=5)
    frame = FrameStep(model.lm, model.mimi, sampler, 3, graph=graph, span_bucket=span_bucket)
    outs = []
    for t in range(inputs.shape[0]):
        if t == RECYCLE_AT:  # a new conversation in slot 2 while the others run on
            frame.reset_rows(torch.tensor([False, False, True], device=device))
            sampler.configure(
                2,
                MoshiSampling(use_sampling=True, temperature=0.9, top_k=5, temperature_text=0.9, top_k_text=5),
                seed=11,
            )
        out = frame(inputs[t])
        outs.append((out.tokens.cpu().numpy(), out.audio.float().cpu().numpy()))
    return outs


def _inputs(model: LoadedModel, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(4)
    return (0.3 * torch.randn(FRAMES, 3, model.mimi.frame_size, generator=gen)).to(device)


def test_attention_over_the_context_in_use_decodes_what_the_whole_ring_does(loaded: LoadedModel) -> None:
    inputs = _inputs(loaded, torch.device("cpu"))
    capacity = loaded.lm.transformer.capacity
    bucketed = _run(loaded, inputs, span_bucket=16)
    whole = _run(loaded, inputs, span_bucket=capacity)
    for t, ((tokens_a, audio_a), (tokens_b, audio_b)) in enumerate(zip(bucketed, whole)):
        assert np.array_equal(tokens_a, tokens_b), f"frame {t}: tokens differ"
        np.testing.assert_allclose(audio_a, audio_b, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_the_cuda_graph_replay_gives_the_eager_steps_tokens_and_audio(tiny: TinyCheckpoint) -> None:
    model = load_folder(tiny.folder, device=torch.device("cuda"), dtype=torch.float32)
    inputs = _inputs(model, torch.device("cuda"))
    eager = _run(model, inputs, span_bucket=16)
    graphed = _run(model, inputs, span_bucket=16, graph=True)
    for t, ((tokens_a, audio_a), (tokens_b, audio_b)) in enumerate(zip(eager, graphed)):
        assert np.array_equal(tokens_a, tokens_b), f"frame {t}: tokens differ"
        np.testing.assert_allclose(audio_a, audio_b, atol=1e-5)


def test_an_idle_row_does_not_widen_attention_for_the_active_ones(loaded: LoadedModel) -> None:
    """Row 1 idles on (never reopened) while row 0 starts a new conversation: the span follows
    row 0 only, row 0 decodes exactly what whole-ring attention gives, and row 1 stays finite."""
    inputs = _inputs(loaded, torch.device("cpu"))[:, :2]
    active = np.array([True, False])
    runs = []
    for bucket in (16, loaded.lm.transformer.capacity):
        frame = FrameStep(
            loaded.lm, loaded.mimi, SlotSampler(2, torch.device("cpu"), MoshiSampling()), 2, span_bucket=bucket
        )
        outs = []
        for t in range(36):
            if t == 20:
                frame.reset_rows(torch.tensor([True, False]))
            if t >= 20 and bucket == 16:
                assert frame.span(active) == 16, "the idle row (position > 20) widened the span"
            out = frame(inputs[t], active)
            assert torch.isfinite(out.audio).all()
            outs.append(out.tokens[0].clone())
        runs.append(outs)
    for t, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"frame {t}: the active row's tokens differ"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_the_served_frame_model_replays_graphs_with_prompts_sampling_and_recycling(tiny: TinyCheckpoint) -> None:
    """MoshiFrameModel on a GPU (graphed by default) against the same model stepped eagerly:
    a persona prefill (teacher forcing), a sampling slot, and a slot reopened mid-run."""
    from rtserve.engines.moshi.frame_model import MoshiFrameModel
    from rtserve.engines.values import SlotPrompt, SlotSampling

    loaded = load_folder(tiny.folder, device=torch.device("cuda"), dtype=torch.float32)
    inputs = (0.3 * np.random.default_rng(5).standard_normal((FRAMES, 2, loaded.mimi.frame_size))).astype(np.float32)
    hot = SlotSampling(text_temperature=1.0, audio_temperature=0.9, audio_top_k=8)
    traces = []
    for graph in (False, True):
        model = MoshiFrameModel(loaded, 2, sampling=MoshiSampling(), graph=graph)
        assert model.frame.graphed == graph
        prefill = model.open_slot(0, SlotPrompt(text="you are kind"))
        model.open_slot(1, SlotPrompt(seed=3, sampling=hot))
        trace = []
        for t in range(FRAMES):
            if t == RECYCLE_AT:
                model.open_slot(1, SlotPrompt(seed=4, sampling=hot))
            if t < prefill:
                model.prefill_step(0)
            outs = model.step(inputs[t], np.array([t >= prefill, True]))
            trace.append([(o.audio.copy(), o.text) if o is not None else None for o in outs])
        traces.append(trace)
    for t, (eager, graphed) in enumerate(zip(*traces)):
        for slot, (a, b) in enumerate(zip(eager, graphed)):
            assert (a is None) == (b is None), f"frame {t} slot {slot}"
            if a is not None and b is not None:
                assert a[1] == b[1], f"frame {t} slot {slot}: text differs"
                np.testing.assert_allclose(a[0], b[0], atol=1e-5, err_msg=f"frame {t} slot {slot}")
