"""A tiny random vision-language model built offline (no downloads): LLaVA's architecture
(a CLIP vision tower, a Llama text model) at toy sizes, a word-level tokenizer and a
``LlavaProcessor``, saved as a model folder ``cascade.llm_runtime: transformers_vision`` loads
through ``AutoModelForImageTextToText`` / ``AutoProcessor``.

A 32x32 image is 4 patches of 16: every image is 4 ``<image>`` tokens in the model's input.
``ModelInputs`` records what reaches the model's forward, so a test sees those tokens."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from rtserve.config import ServerConfig

WORDS = [
    *("<unk>", "<s>", "</s>", "<image>", "user", "assistant", "system", ":"),
    *("what", "do", "you", "see", "the", "a", "cat", "red", "blue", "green", "is", "it", "i"),
]
IMAGE_TOKEN = WORDS.index("<image>")
TOKENS_PER_IMAGE = 4
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image> {% else %}{{ p['text'] }} "
    "{% endif %}{% endfor %}{% endif %} </s> {% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def build_tiny_vlm(folder: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>", chat_template=TEMPLATE
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})  # split out of "<image><image>"
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tokenizer,
        patch_size=16,
        vision_feature_select_strategy="default",
        chat_template=TEMPLATE,
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
            projection_dim=16,
        ),
        text_config=LlamaConfig(
            vocab_size=len(WORDS),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def vision_config(config: ServerConfig, folder: Path) -> ServerConfig:
    """The embedded cascade with the tiny VLM as its LLM (short replies: a random model rambles)."""
    config.engine = "cascade"
    config.models.llm = str(folder)
    config.cascade.llm_runtime = "transformers_vision"
    config.cascade.llm_context_tokens = 512
    return config


@dataclass
class ModelInputs:
    """Every prefill's ``input_ids`` and image batch shape, as the model's forward got them."""

    prefills: list[tuple[list[int], tuple[int, ...]]] = field(default_factory=list)

    def image_tokens(self) -> list[int]:
        return [ids.count(IMAGE_TOKEN) for ids, _ in self.prefills]


@contextmanager
def recorded_inputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelInputs]:
    from transformers import LlavaForConditionalGeneration

    seen = ModelInputs()
    forward = LlavaForConditionalGeneration.forward

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        pixels = kwargs.get("pixel_values")
        if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] > 1:  # a prefill, not a step
            seen.prefills.append((kwargs["input_ids"][0].tolist(), tuple(pixels.shape) if pixels is not None else ()))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(LlavaForConditionalGeneration, "forward", recording)
    yield seen


def jpeg_bytes(color: str = "red", size: tuple[int, int] = (320, 240)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG")
    return out.getvalue()


def png_bytes(color: str = "blue", size: tuple[int, int] = (64, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def data_url(image: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"
