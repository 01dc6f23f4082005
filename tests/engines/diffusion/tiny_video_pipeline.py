"""A tiny random Wan text-to-video pipeline built from ``diffusers`` and ``transformers`` configs
and saved with ``save_pretrained``: what the video engine loads in tests, no download.

The UMT5 tokenizer is built offline: a word-level vocabulary of a few words (anything else is
``<unk>``), as a ``PreTrainedTokenizerFast`` that ``from_pretrained`` reads back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

WORDS = ("a", "cat", "dog", "on", "the", "beach", "sunrise", "over", "water", "mist")


def tiny_wan_pipeline(seed: int = 0) -> Any:
    """A ``WanPipeline``, typed as rtserve types one (``video_model.WanVideoStepModel``): diffusers
    registers a pipeline's components at run time, so its type does not know them."""
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8
        )
    )
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    pipe: Any = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    parts: tuple[Any, ...] = (text_encoder, vae, transformer)  # torch modules; diffusers' types do not show eval()
    for part in parts:
        part.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def write_tiny_wan(folder: Path) -> Path:
    """The tiny pipeline in ``save_pretrained`` layout under ``folder``; returns ``folder``."""
    tiny_wan_pipeline().save_pretrained(folder)
    return folder
