"""Fixtures: one tiny random Kyutai TTS checkpoint (CFG-distilled) and one with direct CFG."""

from __future__ import annotations

import pytest
import torch

from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint


@pytest.fixture(scope="session")
def tiny_tts(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    torch.set_num_threads(1)
    return write_tts_checkpoint(tmp_path_factory.mktemp("kyutai_tts") / "weights", distilled=True)


@pytest.fixture(scope="session")
def tiny_tts_direct_cfg(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    torch.set_num_threads(1)
    return write_tts_checkpoint(tmp_path_factory.mktemp("kyutai_tts_cfg") / "weights", distilled=False)
