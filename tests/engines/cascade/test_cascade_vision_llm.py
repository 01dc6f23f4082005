"""The cascade's vision runtime (``cascade.llm_runtime: transformers_vision``) on a tiny random
LLaVA built offline (docs/video.md#the-llm-stage): each image of a user turn is its image tokens
in the model's input, with its pixels; history that outgrows the context loses its oldest turns
(with their images); function calls are refused, typed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rtserve.codecs.images import image_data_url
from rtserve.config import ServerConfig
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.llm_vision import VisionLlm
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams, ToolSpec
from tests.tiny_vlm import TOKENS_PER_IMAGE, build_tiny_vlm, jpeg_bytes, recorded_inputs, vision_config


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VisionLlm]:
    from rtserve.config import load_config

    config = vision_config(load_config(environ={}), build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm")))
    config.cascade.llm_context_tokens = 256
    llm = create_llm(config, CascadeMetrics(CollectorRegistry()))
    assert isinstance(llm, VisionLlm) and llm.supports_vision
    asyncio.run(llm.start())
    yield llm
    llm.stop()


async def _answer(llm: VisionLlm, messages: list[ChatMessage], **params: object) -> str:
    sampling = SamplingParams(temperature=0.0, max_tokens=4, **params)  # type: ignore[arg-type]
    return "".join([d.text async for d in llm.generate(messages, sampling, fit_history=True)])


async def test_each_image_is_its_tokens_in_the_prompt(
    vlm: VisionLlm, config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = tuple(image_data_url(jpeg_bytes(color), config.video_input) for color in ("red", "blue", "green"))
    with recorded_inputs(monkeypatch) as seen:
        await _answer(vlm, [ChatMessage("user", "what do you see", images=frames)])
        await _answer(vlm, [ChatMessage("user", "what do you see")])
    assert seen.image_tokens() == [3 * TOKENS_PER_IMAGE, 0]
    assert seen.prefills[0][1][0] == 3 and seen.prefills[1][1] == ()


async def test_old_turns_and_their_images_go_when_the_context_is_full(
    vlm: VisionLlm, config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = image_data_url(jpeg_bytes(), config.video_input)
    long_turn = " ".join(["what do you see"] * 60)  # 240 tokens: with the rest, over the context of 256
    history = [
        ChatMessage("system", "be brief"),
        ChatMessage("user", long_turn, images=(frame,)),
        ChatMessage("assistant", "a cat"),
        ChatMessage("user", "and now", images=(frame, frame)),
    ]
    with recorded_inputs(monkeypatch) as seen:
        await _answer(vlm, history)
    assert seen.image_tokens() == [2 * TOKENS_PER_IMAGE]  # the newest turn's two images only
    assert len(seen.prefills[0][0]) < 100


async def test_function_calls_are_refused(vlm: VisionLlm) -> None:
    with pytest.raises(EngineError) as refused:
        await _answer(vlm, [ChatMessage("user", "hi")], tools=(ToolSpec("lookup"),))
    assert refused.value.code == "invalid_value"


def test_the_path_must_be_a_vision_model(tmp_path: Path, config: ServerConfig) -> None:
    from rtserve.engines.cascade.errors import ModelUnavailable
    from rtserve.engines.cascade.llm_vision import load_vlm

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelUnavailable, match=r"models\.llm: cannot load a vision-language model"):
        load_vlm(tmp_path, 1)
