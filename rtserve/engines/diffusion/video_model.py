"""Text and image to video on a Wan pipeline's components, stepped by the diffusion batcher
(docs/engines.md#video-generation).

``WanVideoStepModel`` is a ``StepModel``: ``prepare`` encodes a request's prompt (and, image to
video, its first frame through the VAE), ``step`` runs ONE transformer call over every row of a
wave (classifier-free guidance rows included) with per-row, per-token timesteps, then each
request's own flow-matching scheduler; ``finish`` hands back the denoised latents. Decoding is
left to ``decode_segments``, which runs the VAE's causal decoder one latent frame at a time so
frames can be encoded and sent while the rest are still being decoded.

Image to video conditions as Wan 2.2's TI2V does: the image's latent is the first latent frame,
held fixed at timestep 0 while the others are denoised, so text and image requests of one shape
share a wave.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

from rtserve.codecs.fmp4 import RgbFrames
from rtserve.engines.diffusion.state import StepState
from rtserve.engines.diffusion.video_request import VideoRequest


@dataclass(eq=False)
class VideoState(StepState):
    latents: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    embeds: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [cond] or [cond, uncond]
    guidance_scale: float = 1.0
    scheduler: Any = None
    condition: torch.Tensor | None = None  # image to video: the first latent frame
    mask: torch.Tensor | None = None  # 0 where the condition is held, 1 where denoised


class WanVideoStepModel:
    """The batcher's ``StepModel`` for a ``WanPipeline`` (engine thread only)."""

    def __init__(self, pipe: Any, *, max_sequence_length: int = 226) -> None:
        self.pipe = pipe  # a diffusers ``WanPipeline``: its components are registered at run time, untyped
        self.max_sequence_length = max_sequence_length  # one padded length: rows of a wave stack
        self.device = pipe.transformer.device
        self.dtype = pipe.transformer.dtype
        self.patch = pipe.transformer.config.patch_size[1]  # latent pixels per token side
        self.frame_multiple = pipe.vae_scale_factor_temporal
        self.size_multiple = pipe.vae_scale_factor_spatial * self.patch

    @torch.inference_mode()
    def prepare(self, request: VideoRequest) -> VideoState:
        pipe = self.pipe
        cfg = request.guidance_scale > 1.0
        cond, uncond = pipe.encode_prompt(
            request.prompt,
            request.negative_prompt,
            do_classifier_free_guidance=cfg,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
            dtype=self.dtype,
        )
        generator = torch.Generator("cpu")
        generator.manual_seed(request.seed if request.seed is not None else int(torch.seed() % 2**63))
        latents = pipe.prepare_latents(
            1,
            pipe.transformer.config.in_channels,
            request.height,
            request.width,
            request.num_frames,
            torch.float32,
            torch.device("cpu"),  # noise from a CPU generator: the same seed gives the same video anywhere
            generator,
        ).to(self.device)
        scheduler = copy.deepcopy(pipe.scheduler)  # its own step index and sigmas
        scheduler.set_timesteps(request.num_inference_steps, device=self.device)
        state = VideoState(
            key=(request.width, request.height, request.num_frames, cfg),
            steps_total=request.num_inference_steps,
            latents=latents,
            embeds=torch.cat([cond, uncond]) if cfg else cond,
            guidance_scale=request.guidance_scale,
            scheduler=scheduler,
        )
        if request.image is not None:
            state.condition = self._encode_image(request.image)
            state.mask = torch.ones_like(latents)
            state.mask[:, :, 0] = 0
        return state

    def _encode_image(self, image: RgbFrames) -> torch.Tensor:
        vae = self.pipe.vae
        # (1, 3, H, W) in [-1, 1]; a copy: the route's array is read-only
        pixels = torch.from_numpy(image.copy()).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        encoded = vae.encode(pixels.unsqueeze(2).to(self.device, vae.dtype)).latent_dist.mode()
        mean, inv_std = self._latent_stats()
        latent: torch.Tensor = ((encoded.float() - mean) * inv_std).to(self.device)
        return latent

    def _latent_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.pipe.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=self.device).view(shape)
        inv_std = 1.0 / torch.tensor(config.latents_std, device=self.device).view(shape)
        return mean, inv_std

    @staticmethod
    def _held(state: VideoState) -> torch.Tensor:
        if state.condition is None or state.mask is None:
            return state.latents
        return (1 - state.mask) * state.condition + state.mask * state.latents

    @torch.inference_mode()
    def step(self, states: Sequence[VideoState]) -> None:
        cfg = states[0].embeds.shape[0] == 2  # equal keys: all or none guided
        latents = torch.cat([self._held(s) for s in states])
        timesteps = torch.stack([self._token_timesteps(s) for s in states])
        embeds = torch.cat([s.embeds[:1] for s in states])
        if cfg:  # guided rows twice: conditional then unconditional, one call
            latents = torch.cat([latents, latents])
            timesteps = torch.cat([timesteps, timesteps])
            embeds = torch.cat([embeds, torch.cat([s.embeds[1:] for s in states])])
        noise = self.pipe.transformer(
            hidden_states=latents.to(self.dtype),
            timestep=timesteps,
            encoder_hidden_states=embeds,
            return_dict=False,
        )[0].float()
        if cfg:
            cond, uncond = noise.chunk(2)
            scale = torch.tensor([s.guidance_scale for s in states], device=noise.device).view(-1, 1, 1, 1, 1)
            noise = uncond + scale * (cond - uncond)
        for row, state in enumerate(states):
            t = state.scheduler.timesteps[state.steps_done]
            state.latents = state.scheduler.step(noise[row : row + 1], t, state.latents, return_dict=False)[0]
            state.steps_done += 1

    def _token_timesteps(self, state: VideoState) -> torch.Tensor:
        # One timestep per latent token (Wan 2.2's expanded timesteps): 0 on a held first frame.
        t = state.scheduler.timesteps[state.steps_done]
        mask = state.mask if state.mask is not None else torch.ones_like(state.latents)
        timesteps: torch.Tensor = (mask[0][0][:, :: self.patch, :: self.patch] * t).flatten()
        return timesteps

    def finish(self, states: Sequence[VideoState]) -> list[torch.Tensor]:
        return [self._held(s) for s in states]

    @torch.inference_mode()
    def decode_segments(self, latents: torch.Tensor) -> Iterator[RgbFrames]:
        """The video of ``latents`` (one request's), a latent frame at a time (the VAE's causal
        decoder with a cache of its own, so decodes on several threads do not share state). The
        first latent frame decodes to one picture; it goes out with the next latent frame's
        ``frame_multiple``: a stream starting on one picture (62 ms at 16 fps) would stall
        before the second segment, which takes a latent frame's decode (~135 ms at 832x480 on
        an H200) to arrive."""
        vae = self.pipe.vae
        mean, inv_std = self._latent_stats()
        x = vae.post_quant_conv((latents / inv_std + mean).to(vae.dtype))
        cache: list[Any] = [None] * vae._cached_conv_counts["decoder"]
        held: RgbFrames | None = None
        for i in range(x.shape[2]):
            out = vae.decoder(x[:, :, i : i + 1], feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
            if vae.config.patch_size is not None:
                out = unpatchify(out, patch_size=vae.config.patch_size)  # type: ignore[no-untyped-call]
            pixels = out.clamp(-1, 1)[0].permute(1, 2, 3, 0)  # (frames, H, W, 3)
            frames = ((pixels.float() + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
            if i == 0 and x.shape[2] > 1:
                held = frames
                continue
            if held is not None:
                frames, held = np.concatenate([held, frames]), None
            yield np.ascontiguousarray(frames)
