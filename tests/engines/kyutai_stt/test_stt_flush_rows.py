"""Flush rows (``stt_engine.flush_rows``): a drain step of a few streams runs in a batch of its own
on the same weights, their state copied in and back. What a stream hears is unchanged: a drained
row's transcript is still the reference ``LMGen``'s of its own frames, a row that is never drained
goes on bit-identical to a run without drain steps, and a drain step of more rows than the flush
batch holds steps the whole batch as before."""

from __future__ import annotations

import pytest
import torch

from rtserve.config import ConfigError, SttEngineConfig, load_config
from rtserve.engines.kyutai_stt.frame_model import SttFrameModel
from rtserve.engines.kyutai_stt.loader import SttModel, stt_model
from rtserve.engines.moshi.loader import load_folder
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
