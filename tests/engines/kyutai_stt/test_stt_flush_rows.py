"""Flush rows (``stt_engine.flush_rows``): a drain step of a few streams runs in a batch of its own
on the same weights, their state copied in and back. What a stream hears is unchanged: a drained
row's transcript is still the reference ``LMGen``'s of its own frames, a row that is never drained
goes on bit-identical to a run without drain steps, and a drain step of more rows than the flush
batch holds steps the whole batch as before. A burst (``step_rows_burst``: several frames of a few
rows in one call) keeps those guarantees."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from rtserve.config import ConfigError, SttEngineConfig, load_config
from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_stt.loader import SttModel, stt_model
from rtserve.engines.moshi.loader import load_folder
from rtserve.engines.values import FrameOutput, SlotPrompt, TranscriptStep
from tests.engines.kyutai_stt.stt_tiny import TinyStt
from tests.engines.kyutai_stt.test_stt_drain import BATCH, TICKS, _drive, _plan, assert_reference_transcripts
from tests.engines.kyutai_stt.test_stt_parity import _audio


@pytest.mark.parametrize("flush_rows", [1, 2])
def test_rows_drained_in_the_flush_batch_keep_the_reference_transcript(
    tiny_stt: TinyStt, stt: SttModel, flush_rows: int
) -> None:
    """The plan drains row 0 alone and rows 0 and 1 together: with one flush row the pairs step in
    the whole batch (held), with two every drain step goes through the flush batch."""
    audio = _audio(TICKS * 2, BATCH, seed=7)
    model = SttFrameModel(stt, BATCH, drains=True, flush_rows=flush_rows)
    emitted, taken = _drive(model, audio, _plan(drains=True))
    assert model.flush is not None and model.flush.positions[0] > 0  # the flush batch stepped
    assert_reference_transcripts(tiny_stt, audio, emitted, taken)


def test_a_row_never_drained_is_bit_identical_with_flush_rows(stt: SttModel) -> None:
    _undrained_row_matches_a_plain_run(stt, graph=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_of_the_flush_batch_leave_other_rows_bit_identical(tiny_stt: TinyStt) -> None:
    model = stt_model(load_folder(tiny_stt.folder, device=torch.device("cuda"), dtype=torch.float32))
    _undrained_row_matches_a_plain_run(model, graph=True)


def _undrained_row_matches_a_plain_run(stt: SttModel, *, graph: bool) -> None:
    audio = _audio(TICKS * 2, BATCH, seed=8)
    plain = _drive(SttFrameModel(stt, BATCH, graph=graph), audio, _plan(drains=False))[0]
    flushed = _drive(SttFrameModel(stt, BATCH, drains=True, flush_rows=2, graph=graph), audio, _plan(drains=True))[0]
    assert flushed[2] == plain[2]
    assert len(plain[2]) >= TICKS - stt.loaded.lm_config.max_delay - 1


def test_flush_rows_with_paged_kv_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="flush_rows needs kv_cache 'ring'"):
        load_config(environ={"RTSERVE_STT_ENGINE__FLUSH_ROWS": "16", "RTSERVE_STT_ENGINE__KV_CACHE": "paged_int8"})
    assert SttEngineConfig(flush_rows=16).flush_rows == 16


def _drive_bursts(model: SttFrameModel, audio: np.ndarray) -> tuple[list[list[TranscriptStep]], list[int]]:
    """Every tick steps all rows; after every fourth tick row 0 gets a burst of two frames
    (``step_rows_burst``), after every eighth rows 0 and 1 one of two. Per row: the transcript steps
    it emitted, and how many frames it took."""
    for slot in range(BATCH):
        model.open_slot(slot, SlotPrompt())
    taken = [0] * BATCH
    emitted: list[list[TranscriptStep]] = [[] for _ in range(BATCH)]

    def keep(outputs: Sequence[FrameOutput | None], rows: list[int]) -> None:
        for slot in range(BATCH):
            output = outputs[slot]
            assert (output is not None) == (slot in rows), "a held row answered, or a stepped one did not"
            if output is not None and output.transcript is not None:
                emitted[slot].append(output.transcript)

    for tick in range(TICKS):
        frames = np.stack([audio[taken[slot], slot] for slot in range(BATCH)])
        taken = [n + 1 for n in taken]
        keep(model.step(frames, np.ones(BATCH, bool)), list(range(BATCH)))
        rows = [0] if tick % 4 == 1 else [0, 1] if tick % 8 == 3 else []
        if rows:
            burst = np.stack([[audio[taken[slot] + k, slot] for slot in rows] for k in range(2)])
            for slot in rows:
                taken[slot] += 2
            for outputs in model.step_rows_burst(burst, np.array(rows)):
                keep(outputs, rows)
    return emitted, taken


def test_rows_drained_in_bursts_keep_the_reference_transcript(tiny_stt: TinyStt, stt: SttModel) -> None:
    """Several frames of a few rows in one call (their state copied in and back once) hear what
    the reference hears from the same frames."""
    audio = _audio(TICKS * 2, BATCH, seed=9)
    model = SttFrameModel(stt, BATCH, drains=True, flush_rows=2)
    assert model.burst_rows == 2
    emitted, taken = _drive_bursts(model, audio)
    assert_reference_transcripts(tiny_stt, audio, emitted, taken)


def test_a_row_never_in_a_burst_is_bit_identical(stt: SttModel) -> None:
    """Row 2 is never drained: its transcript is exactly the one of a run without drain steps."""
    audio = _audio(TICKS * 2, BATCH, seed=10)
    plain = _drive(SttFrameModel(stt, BATCH), audio, _plan(drains=False))[0]
    bursts = _drive_bursts(SttFrameModel(stt, BATCH, drains=True, flush_rows=2), audio)[0]
    assert bursts[2] == plain[2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphed_bursts_equal_eager_ones(tiny_stt: TinyStt) -> None:
    """A graphed step's outputs are overwritten by the next replay: a burst keeps a copy of each
    step's, so every row's transcript is the eager run's."""
    stt = stt_model(load_folder(tiny_stt.folder, device=torch.device("cuda"), dtype=torch.float32))
    audio = _audio(TICKS * 2, BATCH, seed=10)
    runs = [
        _drive_bursts(SttFrameModel(stt, BATCH, drains=True, flush_rows=2, graph=graph), audio)[0]
        for graph in (False, True)
    ]
    assert runs[1] == runs[0]


def test_without_flush_rows_there_are_no_bursts(stt: SttModel) -> None:
    assert SttFrameModel(stt, BATCH, drains=True).burst_rows == 0
