"""A tiny random Stable Diffusion (or SDXL) pipeline built from ``diffusers`` and ``transformers``
configs, saved with ``save_pretrained``: what the image engine loads in tests, no download.

The CLIP tokenizer is built offline too: a byte-level vocabulary (every byte alone and as a
word end) with no merges, so any prompt tokenizes; prompts are cut at ``MAX_TOKENS``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DiffusionPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

MAX_TOKENS = 16
SIZE = 64  # the size the tiny UNet was "trained" at; any multiple of 4 works


def tiny_tokenizer(folder: Path) -> CLIPTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    vocab = {token: i for i, token in enumerate([*chars, *(c + "</w>" for c in chars)])}
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=MAX_TOKENS)


def _text_config(vocab_size: int, projection_dim: int = 32) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_TOKENS,
        projection_dim=projection_dim,
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
    )


def _vae() -> AutoencoderKL:
    return AutoencoderKL(
        block_out_channels=(8, 16, 16),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        latent_channels=4,
        norm_num_groups=8,
        layers_per_block=1,
        sample_size=SIZE,
    )


def _unet(xl: bool) -> UNet2DConditionModel:
    extra: dict[str, Any] = {}
    if xl:  # SDXL's added conditioning: pooled text embeds + 6 size/crop ids
        extra = {
            "addition_embed_type": "text_time",
            "addition_time_embed_dim": 8,
            "projection_class_embeddings_input_dim": 8 * 6 + 32,
            "cross_attention_dim": 64,  # SDXL concatenates both text encoders' hidden states
        }
    return UNet2DConditionModel(
        sample_size=SIZE // 4,
        in_channels=4,
        out_channels=4,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=4,
        cross_attention_dim=extra.pop("cross_attention_dim", 32),
        **extra,
    )


def save_tiny_pipeline(folder: Path, *, xl: bool = False, seed: int = 0) -> Path:
    """Write a random pipeline into ``folder`` (model_index.json + components) and return it."""
    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer(folder / "_tokenizer")
    vocab = len(tokenizer)
    scheduler = DDIMScheduler(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False, steps_offset=1
    )
    pipe: Any
    if xl:
        pipe = StableDiffusionXLPipeline(
            vae=_vae(),
            text_encoder=CLIPTextModel(_text_config(vocab)),
            text_encoder_2=CLIPTextModelWithProjection(_text_config(vocab)),
            tokenizer=tokenizer,
            tokenizer_2=tokenizer,
            unet=_unet(xl=True),
            scheduler=scheduler,
        )
    else:
        pipe = StableDiffusionPipeline(
            vae=_vae(),
            text_encoder=CLIPTextModel(_text_config(vocab)),
            tokenizer=tokenizer,
            unet=_unet(xl=False),
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    pipe.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_sd_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny-sd"))


@pytest.fixture(scope="session")
def tiny_sd(tiny_sd_folder: Path) -> Any:
    pipe = DiffusionPipeline.from_pretrained(tiny_sd_folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: one thread, or oversubscribed cores spin for seconds a step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
