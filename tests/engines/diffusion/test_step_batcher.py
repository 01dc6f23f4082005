"""The step batcher on the tiny random pipeline: images equal the plain diffusers pipeline's
for the same seed (alone and batched), concurrent requests share denoiser calls, requests join
mid-flight, cancellation frees the slot at the next step, the queue is bounded, an
incompatible size waits for the batch to drain, a failed prepare fails only its request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from rtserve.engines.diffusion.batcher import StepBatcher
from rtserve.engines.diffusion.job import DiffusionJob
from rtserve.engines.diffusion.service import ImageRequest
from rtserve.engines.diffusion.unet import UNetState, UNetStepModel
from rtserve.engines.errors import EngineError
from rtserve.errors import CANCELLED, INVALID_VALUE, RESOURCE_EXHAUSTED
from tests.engines.diffusion.tiny_pipeline import save_tiny_pipeline

Batcher = StepBatcher[ImageRequest, UNetState, Image.Image]


def _plain(pipe: Any, r: ImageRequest) -> np.ndarray[Any, np.dtype[np.int16]]:
    """What diffusers' own pipeline makes for ``r``, alone."""
    image = pipe(
        r.prompt,
        negative_prompt=r.negative_prompt,
        height=r.height,
        width=r.width,
        num_inference_steps=r.steps,
        guidance_scale=r.guidance_scale,
        generator=torch.Generator().manual_seed(r.seed),
    ).images[0]
    return np.asarray(image, dtype=np.int16)


def _close(image: Image.Image, expected: np.ndarray[Any, np.dtype[np.int16]]) -> None:
    # Batched float rounding may flip a pixel's last bit; a different image differs everywhere.
    assert np.abs(np.asarray(image, dtype=np.int16) - expected).max() <= 2


async def _run(pipe: Any, requests: list[ImageRequest], **limits: int) -> tuple[list[Image.Image], Batcher]:
    batcher = Batcher(UNetStepModel(pipe), name="test", **{"max_batch": 8, "max_queued": 8, **limits})
    batcher.start()
    try:
        jobs = batcher.submit(requests)
        return list(await asyncio.gather(*(job.result() for job in jobs))), batcher
    finally:
        await batcher.stop()


async def test_batched_images_equal_the_plain_pipeline_alone(tiny_sd: Any) -> None:
    requests = [
        ImageRequest("a red cup", 64, 64, steps=4, guidance_scale=7.5, seed=1),
        ImageRequest("a blue bird", 64, 64, steps=6, guidance_scale=1.0, seed=2),  # no CFG row, more steps
        ImageRequest("a cat", 64, 64, steps=4, guidance_scale=3.0, seed=3, negative_prompt="blurry"),
    ]
    images, batcher = await _run(tiny_sd, requests)
    for image, request in zip(images, requests, strict=True):
        assert image.size == (64, 64)
        _close(image, _plain(tiny_sd, request))
    stats = batcher.stats()
    assert stats.steps == 6  # the longest request's steps: the others rode along
    assert stats.shared_steps == 4
    assert stats.rows == 4 + 6 + 4
    assert stats.finished == 3


async def test_a_request_joins_a_running_batch_at_a_step_boundary(tiny_sd: Any) -> None:
    first = ImageRequest("a house", 64, 64, steps=8, guidance_scale=7.5, seed=5)
    second = ImageRequest("a tree", 64, 64, steps=3, guidance_scale=7.5, seed=6)
    batcher = Batcher(UNetStepModel(tiny_sd), max_batch=4, max_queued=4, name="test")
    batcher.start()
    try:
        started = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_progress(job: DiffusionJob[Image.Image]) -> None:
            if job.steps_done == 2:
                loop.call_soon_threadsafe(started.set)

        [job1] = batcher.submit([first], on_progress=on_progress)
        await started.wait()
        [job2] = batcher.submit([second])
        image1, image2 = await job1.result(), await job2.result()
        assert job2.steps_done == job2.steps_total == 3
    finally:
        await batcher.stop()
    _close(image1, _plain(tiny_sd, first))
    _close(image2, _plain(tiny_sd, second))
    stats = batcher.stats()
    assert stats.steps == 8 and stats.shared_steps == 3


async def test_cancel_frees_the_slot_at_the_next_step(tiny_sd: Any) -> None:
    batcher = Batcher(UNetStepModel(tiny_sd), max_batch=1, max_queued=4, name="test")
    batcher.start()
    try:
        loop = asyncio.get_running_loop()
        stepping = asyncio.Event()

        def on_progress(job: DiffusionJob[Image.Image]) -> None:
            if job.steps_done == 1:
                loop.call_soon_threadsafe(stepping.set)

        [long] = batcher.submit(
            [ImageRequest("long", 64, 64, steps=200, guidance_scale=1.0, seed=1)], on_progress=on_progress
        )
        [waiting] = batcher.submit([ImageRequest("next", 64, 64, steps=2, guidance_scale=1.0, seed=2)])
        await stepping.wait()
        long.cancel()
        with pytest.raises(EngineError) as refused:
            await long.result()
        assert refused.value.code == CANCELLED
        assert (await waiting.result()).size == (64, 64)  # the freed slot served the next request
        stats = batcher.stats()
        assert stats.cancelled == 1 and stats.finished == 1
        assert long.steps_done < 200
    finally:
        await batcher.stop()


async def test_the_queue_is_bounded_and_n_is_queued_whole(tiny_sd: Any) -> None:
    batcher = Batcher(UNetStepModel(tiny_sd), max_batch=1, max_queued=2, name="test")
    batcher.start()
    try:
        request = ImageRequest("x", 64, 64, steps=100, guidance_scale=1.0, seed=1)
        jobs = batcher.submit([request, request])
        with pytest.raises(EngineError) as full:
            batcher.submit([request, request, request])
        assert full.value.code == RESOURCE_EXHAUSTED
        for job in jobs:
            job.cancel()
    finally:
        await batcher.stop()


async def test_an_incompatible_size_waits_for_the_batch_to_drain(tiny_sd: Any) -> None:
    requests = [
        ImageRequest("small", 64, 64, steps=3, guidance_scale=7.5, seed=1),
        ImageRequest("wide", 96, 64, steps=3, guidance_scale=7.5, seed=2),
        ImageRequest("small again", 64, 64, steps=3, guidance_scale=7.5, seed=3),
    ]
    images, batcher = await _run(tiny_sd, requests)
    assert [image.size for image in images] == [(64, 64), (96, 64), (64, 64)]
    _close(images[1], _plain(tiny_sd, requests[1]))
    stats = batcher.stats()
    assert stats.steps == 9 and stats.shared_steps == 0  # FIFO: the third never jumps the wide one


async def test_a_bad_request_fails_alone(tiny_sd: Any) -> None:
    source = Image.new("RGB", (64, 64), (200, 30, 30))
    bad = ImageRequest("edit", 64, 64, steps=2, guidance_scale=7.5, seed=1, image=source, strength=0.1)
    good = ImageRequest("fine", 64, 64, steps=2, guidance_scale=7.5, seed=2)
    batcher = Batcher(UNetStepModel(tiny_sd), max_batch=4, max_queued=4, name="test")
    batcher.start()
    try:
        failing, fine = batcher.submit([bad, good])
        with pytest.raises(EngineError) as refused:
            await failing.result()
        assert (refused.value.code, refused.value.param) == (INVALID_VALUE, "strength")
        assert (await fine.result()).size == (64, 64)
    finally:
        await batcher.stop()


async def test_an_edit_equals_diffusers_img2img(tiny_sd: Any) -> None:
    from diffusers import StableDiffusionImg2ImgPipeline

    source = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    request = ImageRequest("snow", 64, 64, steps=6, guidance_scale=5.0, seed=4, image=source, strength=0.5)
    [image], batcher = await _run(tiny_sd, [request])
    assert batcher.stats().steps == 3  # strength 0.5 of 6 steps
    img2img = StableDiffusionImg2ImgPipeline.from_pipe(tiny_sd)
    expected = img2img(
        "snow",
        image=source,
        strength=0.5,
        num_inference_steps=6,
        guidance_scale=5.0,
        generator=torch.Generator().manual_seed(4),
    ).images[0]
    _close(image, np.asarray(expected, dtype=np.int16))


@pytest.mark.parametrize(
    "scheduler", ["PNDMScheduler", "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler"]
)
async def test_other_schedulers_batch_to_the_plain_pipeline_images(tiny_sd: Any, scheduler: str) -> None:
    """SD 1.x's default (PNDM: multistep history, no generator), a stochastic one (its noise from
    the request's generator), and a multistep solver: per-request scheduler state stays per request."""
    import diffusers

    pipe = type(tiny_sd).from_pipe(
        tiny_sd, scheduler=getattr(diffusers, scheduler).from_config(tiny_sd.scheduler.config)
    )
    pipe.set_progress_bar_config(disable=True)
    requests = [
        ImageRequest("a red cup", 64, 64, steps=5, guidance_scale=7.5, seed=1),
        ImageRequest("a blue bird", 64, 64, steps=4, guidance_scale=1.0, seed=2),
    ]
    images, batcher = await _run(pipe, requests)
    for image, request in zip(images, requests, strict=True):
        _close(image, _plain(pipe, request))
    assert batcher.stats().shared_steps >= 4  # PNDM runs more scheduler steps than num_inference_steps


async def test_sdxl_batches_to_the_plain_pipeline_images(tmp_path: Path) -> None:
    """SDXL's layout: two text encoders, pooled embeds and size ids as added conditioning rows."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(save_tiny_pipeline(tmp_path / "xl", xl=True))
    pipe.set_progress_bar_config(disable=True)
    requests = [
        ImageRequest("a red cup", 64, 64, steps=3, guidance_scale=5.0, seed=1),
        ImageRequest("a blue bird", 64, 64, steps=3, guidance_scale=1.0, seed=2, negative_prompt="dark"),
    ]
    images, batcher = await _run(pipe, requests)
    for image, request in zip(images, requests, strict=True):
        _close(image, _plain(pipe, request))
    assert batcher.stats().shared_steps == 3
