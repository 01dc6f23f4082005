"""Stable Diffusion and SDXL (UNet2DConditionModel pipelines) on the step batcher: text to image
and image edit (img2img), run from the pipeline's own components
(docs/engines.md#diffusion-step-batching).

Per request (``prepare``): the pipeline's ``encode_prompt`` (and SDXL's added time ids), a
scheduler of its own built from the pipeline's scheduler config (its timesteps, its step index,
its multistep history), a seeded generator, the first latents (noise, or the source image's
VAE latents noised to the strength's first timestep). Per step: every request's latents, with
classifier-free guidance rows (negative then positive) for those that use it, go through ONE
UNet call with a timestep per row; each request's guidance and scheduler step run on its slice.
That is what the pipeline's ``__call__`` does for one request, so a request's image is its solo
image up to the float rounding of a larger batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers import AutoPipelineForText2Image
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img import retrieve_latents
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from rtserve.engines.diffusion.service import ImageRequest
from rtserve.engines.diffusion.state import StepState
from rtserve.engines.errors import EngineError
from rtserve.errors import INVALID_VALUE, TASK_UNAVAILABLE


@dataclass(eq=False)
class UNetState(StepState):
    latents: torch.Tensor = field(kw_only=True)  # [1, C, h, w]
    timesteps: torch.Tensor = field(kw_only=True)  # this request's schedule (after the strength cut)
    scheduler: Any = field(kw_only=True)  # its own diffusers scheduler: step index and history are per request
    cond: dict[str, torch.Tensor] = field(kw_only=True)  # UNet conditioning, rows [negative,] positive
    guidance_scale: float = field(kw_only=True)
    generator: torch.Generator = field(kw_only=True)

    @property
    def guided(self) -> bool:
        return self.guidance_scale > 1.0  # diffusers' rule: guidance <= 1 runs the positive row only


class UNetStepModel:
    """A ``StepModel`` over a Stable Diffusion or SDXL pipeline's components."""

    def __init__(self, pipeline: Any) -> None:
        self._pipe = AutoPipelineForText2Image.from_pipe(pipeline)  # shares the loaded components
        self._xl = getattr(self._pipe, "text_encoder_2", None) is not None
        unet = self._pipe.unet
        if unet is None or getattr(self._pipe, "vae", None) is None:
            raise EngineError("the image pipeline has no UNet and VAE (Stable Diffusion layout)", code=TASK_UNAVAILABLE)
        self._device: torch.device = unet.device
        self._dtype: torch.dtype = unet.dtype
        # Stochastic schedulers draw their noise from the request's generator; others take none
        # (the pipeline's prepare_extra_step_kwargs makes the same check).
        self._step_takes_generator = "generator" in inspect.signature(self._pipe.scheduler.step).parameters
        vae = self._pipe.vae
        if vae.dtype == torch.float16 and getattr(vae.config, "force_upcast", False):
            vae.to(torch.float32)  # SDXL's VAE overflows in float16 (the pipeline upcasts it the same way)

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this (the VAE's downsampling, as diffusers checks)."""
        return int(self._pipe.vae_scale_factor)

    # -- StepModel ----------------------------------------------------------------------

    @torch.inference_mode()
    def prepare(self, request: ImageRequest) -> UNetState:
        pipe = self._pipe
        guided = request.guidance_scale > 1.0
        scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        scheduler.set_timesteps(request.steps, device=self._device)
        _check_schedule(scheduler, request.steps)
        timesteps = scheduler.timesteps
        generator = torch.Generator("cpu").manual_seed(request.seed)
        cond = self._encode(request, guided)
        h, w = request.height // self.size_multiple, request.width // self.size_multiple
        shape = (1, pipe.unet.config.in_channels, h, w)
        if request.image is None:
            latents = randn_tensor(shape, generator=generator, device=self._device, dtype=self._dtype)
            latents = latents * scheduler.init_noise_sigma
        else:
            timesteps = self._strength_cut(scheduler, request)
            latents = self._source_latents(request, scheduler, timesteps[:1], generator)
        key = (tuple(latents.shape), tuple((name, tuple(t.shape[1:])) for name, t in sorted(cond.items())))
        return UNetState(
            key=key,
            steps_total=len(timesteps),
            latents=latents,
            timesteps=timesteps,
            scheduler=scheduler,
            cond=cond,
            guidance_scale=request.guidance_scale,
            generator=generator,
        )

    @torch.inference_mode()
    def step(self, states: Sequence[UNetState]) -> None:
        inputs, times = [], []
        for s in states:
            t = s.timesteps[s.steps_done]
            x = s.scheduler.scale_model_input(s.latents, t)
            rows = 2 if s.guided else 1
            inputs.extend([x] * rows)
            times.extend([t.float()] * rows)
        cond = {name: torch.cat([s.cond[name] for s in states]) for name in states[0].cond}
        hidden = cond.pop("encoder_hidden_states")
        noise = self._pipe.unet(
            torch.cat(inputs),
            torch.stack(times).to(self._device),
            encoder_hidden_states=hidden,
            added_cond_kwargs=cond or None,
            return_dict=False,
        )[0]
        row = 0
        for s in states:
            if s.guided:
                negative, positive = noise[row : row + 2].chunk(2)
                prediction = negative + s.guidance_scale * (positive - negative)
                row += 2
            else:
                prediction = noise[row : row + 1]
                row += 1
            t = s.timesteps[s.steps_done]
            extra = {"generator": s.generator} if self._step_takes_generator else {}
            s.latents = s.scheduler.step(prediction, t, s.latents, return_dict=False, **extra)[0]
            s.steps_done += 1

    @torch.inference_mode()
    def finish(self, states: Sequence[UNetState]) -> list[Image.Image]:
        vae = self._pipe.vae
        latents = torch.cat([s.latents for s in states]).to(vae.dtype)
        decoded = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
        images: list[Image.Image] = self._pipe.image_processor.postprocess(decoded, output_type="pil")
        return images

    # -- helpers ------------------------------------------------------------------------

    def _encode(self, request: ImageRequest, guided: bool) -> dict[str, torch.Tensor]:
        """The UNet conditioning rows of one request: ``[negative, positive]`` when guided."""
        pipe = self._pipe
        if not self._xl:
            positive, negative = pipe.encode_prompt(
                request.prompt, self._device, 1, guided, negative_prompt=request.negative_prompt
            )
            return {"encoder_hidden_states": torch.cat([negative, positive]) if guided else positive}
        positive, negative, pooled, negative_pooled = pipe.encode_prompt(
            request.prompt,
            device=self._device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=guided,
            negative_prompt=request.negative_prompt,
        )
        size = (request.height, request.width)
        time_ids = pipe._get_add_time_ids(
            size, (0, 0), size, dtype=positive.dtype, text_encoder_projection_dim=int(pooled.shape[-1])
        ).to(self._device)
        if not guided:
            return {"encoder_hidden_states": positive, "text_embeds": pooled, "time_ids": time_ids}
        return {
            "encoder_hidden_states": torch.cat([negative, positive]),
            "text_embeds": torch.cat([negative_pooled, pooled]),
            "time_ids": torch.cat([time_ids, time_ids]),
        }

    @staticmethod
    def _strength_cut(scheduler: Any, request: ImageRequest) -> torch.Tensor:
        """The img2img schedule: only the last ``strength`` of the steps run (as diffusers' get_timesteps)."""
        kept = min(int(request.steps * request.strength), request.steps)
        if kept < 1:
            raise EngineError(
                "num_inference_steps * strength must be at least 1 for an edit", code=INVALID_VALUE, param="strength"
            )
        start = (request.steps - kept) * scheduler.order
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(start)
        timesteps: torch.Tensor = scheduler.timesteps[start:]
        return timesteps

    def _source_latents(
        self, request: ImageRequest, scheduler: Any, first: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """The source image's latents, noised to the schedule's first timestep."""
        pipe = self._pipe
        pixels = pipe.image_processor.preprocess(request.image, height=request.height, width=request.width)
        pixels = pixels.to(device=self._device, dtype=pipe.vae.dtype)
        latents = retrieve_latents(pipe.vae.encode(pixels), generator=generator) * pipe.vae.config.scaling_factor
        latents = latents.to(self._dtype)
        noise = randn_tensor(latents.shape, generator=generator, device=self._device, dtype=self._dtype)
        noised: torch.Tensor = scheduler.add_noise(latents, noise, first)
        return noised


def _check_schedule(scheduler: Any, steps: int) -> None:
    """Refuse a step count the scheduler cannot run, before the request joins a batch whose step
    it would fail: schedulers that index their training table by timestep (DDIM, PNDM, DDPM) can
    space a count near the table's length past its end (DDIM with ``steps_offset`` 1 asks for
    timestep 1000 of 1000 at 1000 steps)."""
    table = getattr(scheduler, "alphas_cumprod", None)
    timesteps = scheduler.timesteps
    if table is None or timesteps.is_floating_point() or not len(timesteps):
        return
    if int(timesteps.max()) >= len(table):
        raise EngineError(
            f"num_inference_steps={steps} is more than this model's scheduler can run",
            code=INVALID_VALUE,
            param="num_inference_steps",
        )
