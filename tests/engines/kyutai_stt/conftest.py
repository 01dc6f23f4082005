"""Fixtures for the Kyutai STT engine tests: one tiny random STT checkpoint per session."""

from __future__ import annotations

import pytest
import torch

from rtserve.engines.kyutai_stt.loader import SttModel, stt_model
from rtserve.engines.moshi.loader import load_folder
from tests.engines.kyutai_stt.stt_tiny import TinyStt, write_stt_checkpoint


@pytest.fixture(scope="session")
def tiny_stt(tmp_path_factory: pytest.TempPathFactory) -> TinyStt:
    torch.set_num_threads(1)
    return write_stt_checkpoint(tmp_path_factory.mktemp("kyutai_stt") / "weights")


@pytest.fixture
def stt(tiny_stt: TinyStt) -> SttModel:
    return stt_model(load_folder(tiny_stt.folder, device=torch.device("cpu"), dtype=torch.float32))
