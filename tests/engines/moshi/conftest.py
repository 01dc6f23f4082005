"""Fixtures for the moshi engine tests: one tiny random Kyutai-format checkpoint per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rtserve.config import ServerConfig
from rtserve.engines.moshi.loader import LoadedModel, load_folder
from tests.engines.moshi.tiny import TinyCheckpoint, write_checkpoint


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoint:
    torch.set_num_threads(1)  # small shapes: threads only add scheduling noise on a 2-core machine
    return write_checkpoint(tmp_path_factory.mktemp("moshi") / "weights")


@pytest.fixture
def loaded(tiny: TinyCheckpoint) -> LoadedModel:
    return load_folder(tiny.folder, device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture
def weights(tiny: TinyCheckpoint) -> Path:
    return tiny.folder


@pytest.fixture
def moshi_config(config: ServerConfig, weights: Path) -> ServerConfig:
    """``--engine moshi`` on the tiny checkpoint: two slots, greedy, room for a burst of input."""
    return config.model_copy(
        update={
            "engine": "moshi",
            "lockstep": config.lockstep.model_copy(update={"max_input_backlog_ms": 64 * 80}),
            "moshi_engine": config.moshi_engine.model_copy(
                update={"weights": str(weights), "batch_size": 2, "use_sampling": False}
            ),
        }
    )
