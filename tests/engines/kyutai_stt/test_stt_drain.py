"""Drain steps on the Kyutai STT frame model (``step_rows``): rows stepped between ticks on the
input that waited, the other rows held. A row's transcript depends only on its own frames, in
order: it equals the reference ``LMGen`` fed those frames however the steps were spread, and a
held row continues bit-identical to one that was never held (CPU float32, ring and paged KV)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rtserve.config import SttEngineConfig
from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_stt.loader import SttModel, stt_model
from rtserve.engines.moshi.loader import load_folder
from rtserve.engines.moshi.paged_kv import paged_kv_spec
from rtserve.engines.values import SlotPrompt, TranscriptStep
from tests.engines.kyutai_stt.stt_tiny import TinyStt
from tests.engines.kyutai_stt.test_stt_parity import FRAME, PROB_TOLERANCE, _audio, _reference

BATCH = 3
TICKS = 40


def _plan(drains: bool) -> list[np.ndarray]:
    """Per step, the rows it advances: every tick steps all rows; with ``drains`` row 0 also gets
    a drain step after every third tick and rows 0 and 1 after every fifth. Row 2 is never drained."""
    everyone = np.ones(BATCH, bool)
    steps: list[np.ndarray] = []
    for tick in range(TICKS):
        steps.append(everyone)
        if drains and tick % 3 == 1:
            steps.append(np.array([True, False, False]))
        if drains and tick % 5 == 2:
            steps.append(np.array([True, True, False]))
    return steps


def _drive(
    model: SttFrameModel, audio: np.ndarray, plan: list[np.ndarray]
) -> tuple[list[list[TranscriptStep]], list[int]]:
    """Each row takes its own next frame whenever a step advances it. Per row: the transcript steps
    it emitted, and how many frames it took."""
    for slot in range(BATCH):
        model.open_slot(slot, SlotPrompt())
    taken = [0] * BATCH
    emitted: list[list[TranscriptStep]] = [[] for _ in range(BATCH)]
    live = np.ones(BATCH, bool)
    for rows in plan:
        frames = np.zeros((BATCH, FRAME), np.float32)
        for slot in np.flatnonzero(rows).tolist():
            frames[slot] = audio[taken[slot], slot]
            taken[slot] += 1
        outputs = model.step(frames, live) if rows.all() else model.step_rows(frames, rows)
        for slot in range(BATCH):
            output = outputs[slot]
            assert (output is not None) == bool(rows[slot]), "a held row answered, or a stepped one did not"
            if output is not None and output.transcript is not None:
                emitted[slot].append(output.transcript)
    return emitted, taken


def test_drained_rows_keep_the_reference_transcript_of_their_own_frames(tiny_stt: TinyStt, stt: SttModel) -> None:
    audio = _audio(TICKS * 2, BATCH, seed=7)
    emitted, taken = _drive(SttFrameModel(stt, BATCH, drains=True), audio, _plan(drains=True))
    assert_reference_transcripts(tiny_stt, audio, emitted, taken)


def assert_reference_transcripts(
    tiny_stt: TinyStt, audio: np.ndarray, emitted: list[list[TranscriptStep]], taken: list[int]
) -> None:
    """Every row (drained most to least) emitted the reference's tokens for the frames it took."""
    assert taken[0] > taken[1] > taken[2] == TICKS
    for slot in range(BATCH):
        want_tokens, want_probs = _reference(tiny_stt, audio[: taken[slot], slot : slot + 1])
        steps = emitted[slot]
        assert [s.index for s in steps] == list(range(taken[slot] - len(steps), taken[slot]))
        assert [s.token for s in steps] == [row[0] for row in want_tokens], f"slot {slot}"
        worst = max(float(np.abs(np.array(s.scores) - p[0, :, 0]).max()) for s, p in zip(steps, want_probs))
        assert worst < PROB_TOLERANCE, worst


@pytest.mark.parametrize("kv_cache", ["ring", "paged_int8"])
def test_a_held_row_goes_on_bit_identical_to_one_never_held(stt: SttModel, kv_cache: str) -> None:
    """Row 2 is held through every drain step: its transcript is exactly the one of a run with no
    drain steps at all (with paged KV the held rows' writes never reach a block another row reads)."""
    _held_row_matches_a_plain_run(stt, kv_cache, graph=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_cache", ["ring", "paged_int8"])
def test_cuda_graphs_hold_rows_bit_identical(tiny_stt: TinyStt, kv_cache: str) -> None:
    """The same on CUDA graphs (float32): the holding step is its own graph per span."""
    model = stt_model(load_folder(tiny_stt.folder, device=torch.device("cuda"), dtype=torch.float32))
    _held_row_matches_a_plain_run(model, kv_cache, graph=True)


def _held_row_matches_a_plain_run(stt: SttModel, kv_cache: str, *, graph: bool) -> None:
    settings = SttEngineConfig(kv_cache=kv_cache, kv_block_frames=8)
    context = stt.loaded.lm_config.context
    audio = _audio(TICKS * 2, BATCH, seed=8)
    runs = []
    for drains in (False, True):
        spec = paged_kv_spec(settings, BATCH, context)
        model = SttFrameModel(stt, BATCH, drains=drains, paged_kv=spec, graph=graph)
        runs.append(_drive(model, audio, _plan(drains))[0])
    plain, drained = runs
    assert drained[2] == plain[2]
    assert len(plain[2]) >= TICKS - stt.loaded.lm_config.max_delay - 1


def test_a_model_built_without_drains_refuses_to_hold_rows(stt: SttModel) -> None:
    model = SttFrameModel(stt, 2)
    with pytest.raises(ValueError, match="holds=True"):
        model.step_rows(np.zeros((2, FRAME), np.float32), np.array([True, False]))
