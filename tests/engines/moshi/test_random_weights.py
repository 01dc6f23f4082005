"""``moshi_engine.random_weights`` (benchmarking only): the real modules at a folder's shape,
random weights, no weight files and no tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.moshi.engine import build_frame_model
from rtserve.engines.moshi.prompts import PromptError
from rtserve.engines.registry import create_engine
from rtserve.engines.values import SlotPrompt
from tests.web.moshi_support import FRAME, MoshiClient, moshi_server, noise_signal


@pytest.fixture
def shape_only(weights: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint's config files alone: no safetensors, no tokenizer."""
    folder = tmp_path / "shape"
    folder.mkdir()
    for name in ("config.json", "mimi_config.json"):
        shutil.copy(weights / name, folder / name)
    return folder


def _random(config: ServerConfig, folder: Path) -> ServerConfig:
    return config.model_copy(
        update={"moshi_engine": config.moshi_engine.model_copy(update={"weights": str(folder), "random_weights": True})}
    )


def test_a_shape_only_folder_needs_random_weights(moshi_config: ServerConfig, shape_only: Path) -> None:
    plain = moshi_config.model_copy(
        update={"moshi_engine": moshi_config.moshi_engine.model_copy(update={"weights": str(shape_only)})}
    )
    with pytest.raises(ConfigError, match=r"moshi_engine\.weights"):
        build_frame_model(plain)
    model = build_frame_model(_random(moshi_config, shape_only))
    assert model.config.dim == 32 and model.loaded.tokenizer is None
    assert all(bool(p.isfinite().all()) for p in model.loaded.lm.parameters())


def test_random_weights_refuse_persona_text(moshi_config: ServerConfig, shape_only: Path) -> None:
    model = build_frame_model(_random(moshi_config, shape_only))
    with pytest.raises(PromptError, match="tokenizer"):
        model.open_slot(0, SlotPrompt(text="you are a helpful assistant"))
    assert model.open_slot(0, SlotPrompt()) >= 0  # no persona: the slot opens


async def test_random_weights_serve_api_chat(moshi_config: ServerConfig, shape_only: Path) -> None:
    config = _random(moshi_config, shape_only)
    registry = CollectorRegistry()
    engine = create_engine("moshi", config, registry)
    async with moshi_server(config, engine, registry) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url("/api/chat")) as ws:
            client = MoshiClient(ws)
            await client.handshake()
            await client.send_pcm(noise_signal(12, seed=5))
            audio = await client.receive_audio(8 * FRAME)
    assert len(audio) >= 8 * FRAME and float(np.sqrt(np.mean(audio[4 * FRAME :] ** 2))) > 1e-4
    assert not client.text  # no tokenizer: no text stream
