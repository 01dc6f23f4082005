"""The Wan step model against the plain ``diffusers`` ``WanPipeline``: the same latents for the
same seed alone, guided, and in a wave another request joins mid-flight; frames decoded a latent
frame at a time equal the VAE's whole decode; image to video holds the image's latent as the
first frame; the engine batches concurrent requests (docs/engines.md#video-generation)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from rtserve.config import ServerConfig
from rtserve.engines.diffusion import video_engine
from rtserve.engines.diffusion.video_engine import VideoEngine, VideoGenerationJob
from rtserve.engines.diffusion.video_model import WanVideoStepModel
from rtserve.engines.diffusion.video_request import VideoRequest
from tests.engines.diffusion.tiny_video_pipeline import tiny_wan_pipeline

PROMPT = "a cat on the beach"


@pytest.fixture(scope="module")
def pipe() -> Any:  # a diffusers WanPipeline (untyped)
    return tiny_wan_pipeline()


def _plain(pipe, guidance: float, steps: int = 3) -> torch.Tensor:
    out = pipe(
        PROMPT,
        negative_prompt="",
        height=32,
        width=48,
        num_frames=9,
        num_inference_steps=steps,
        guidance_scale=guidance,
        output_type="latent",
        max_sequence_length=32,
        generator=torch.Generator("cpu").manual_seed(7),
    )
    return out.frames


def _request(guidance: float, steps: int = 3, seed: int = 7, image: np.ndarray | None = None) -> VideoRequest:
    return VideoRequest(PROMPT, 48, 32, 9, steps, guidance, seed=seed, image=image)


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_latents_equal_the_plain_pipeline_alone_and_joined_mid_flight(pipe: Any, guidance: float) -> None:
    model = WanVideoStepModel(pipe, max_sequence_length=32)
    expected = _plain(pipe, guidance)
    alone = model.prepare(_request(guidance))
    for _ in range(3):
        model.step([alone])
    assert torch.allclose(model.finish([alone])[0], expected, atol=1e-5)

    first = model.prepare(_request(guidance))
    model.step([first])
    joiner = model.prepare(_request(guidance, steps=2, seed=3))  # joins at the next step boundary
    assert joiner.key == first.key
    model.step([first, joiner])
    model.step([first, joiner])
    assert first.finished and joiner.finished
    assert torch.allclose(model.finish([first])[0], expected, atol=1e-4)


def test_segments_decode_like_the_whole_vae(pipe: Any) -> None:
    model = WanVideoStepModel(pipe, max_sequence_length=32)
    latents = _plain(pipe, 1.0)
    segments = list(model.decode_segments(latents))
    assert [len(s) for s in segments] == [5, 4]  # the first picture goes out with the next four
    config = pipe.vae.config
    scaled = latents * torch.tensor(config.latents_std).view(1, -1, 1, 1, 1) + torch.tensor(config.latents_mean).view(
        1, -1, 1, 1, 1
    )
    whole = pipe.vae.decode(scaled, return_dict=False)[0].clamp(-1, 1)[0].permute(1, 2, 3, 0)
    expected = ((whole + 1) * 127.5).round().to(torch.uint8).numpy()
    assert np.abs(np.concatenate(segments).astype(int) - expected.astype(int)).max() <= 1


def test_image_to_video_holds_the_image_latent_first(pipe: Any) -> None:
    model = WanVideoStepModel(pipe, max_sequence_length=32)
    image = np.random.default_rng(0).integers(0, 255, (1, 32, 48, 3), dtype=np.uint8)
    state = model.prepare(_request(1.0, steps=2, image=image))
    text = model.prepare(_request(1.0, steps=2))
    assert state.key == text.key  # text and image requests of one shape share a wave
    model.step([state, text])
    model.step([state, text])
    out = model.finish([state])[0]
    assert state.condition is not None
    assert torch.equal(out[:, :, :1], state.condition)
    assert not torch.equal(out[:, :, 1:], text.latents[:, :, 1:])


async def _collect(generation: VideoGenerationJob) -> list[np.ndarray]:
    return [segment async for segment in generation.segments()]


async def test_engine_batches_concurrent_requests(config: ServerConfig, pipe: Any) -> None:
    engine = VideoEngine(config, pipeline=pipe)
    await engine.start()
    try:
        generations = [engine.submit(_request(1.0, steps=4, seed=s)) for s in range(3)]
        outputs = await asyncio.gather(*(_collect(g) for g in generations))
        assert all(sum(len(s) for s in segments) == 9 for segments in outputs)
        stats = engine.stats()
        assert stats is not None and stats.finished == 3 and stats.shared_steps >= 3
        assert stats.steps < 12  # fewer denoiser calls than requests x steps
    finally:
        await engine.stop()


async def test_engine_refuses_what_it_cannot_step(config: ServerConfig) -> None:
    two_experts = tiny_wan_pipeline()
    two_experts.register_modules(transformer_2=two_experts.transformer)
    engine = VideoEngine(config, pipeline=two_experts)
    await engine.start()
    assert not engine.ready and engine.failure is not None and "two transformers" in engine.failure
    await engine.stop()


async def test_an_engine_whose_build_runs_out_of_gpu_memory_says_so(
    config: ServerConfig, pipe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def out_of_memory(pipeline: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB.\ntorch's advice")

    monkeypatch.setattr(video_engine, "_wan_model", out_of_memory)
    engine = VideoEngine(config, pipeline=pipe)
    await engine.start()  # kept, not raised into the start's task, where nobody would see it
    try:
        assert not engine.ready
        assert engine.failure == (
            "out of GPU memory while building the engine, which video_engine.weights and video_engine.max_batch "
            "size: "
            "CUDA out of memory. Tried to allocate 4.00 GiB."
        )
    finally:
        await engine.stop()
