"""Random weights of a published LLM shape, as a transformers folder for the cascade's in-process
LLM (``cascade.llm_runtime: transformers_batched``) on a GPU host that has no such checkpoint: the
voice-agent benchmark's LLM stage at the cost of a real model of that size, with the shipped
SmolLM2's tokenizer (its vocabulary and chat template). ``SHAPES``:

* ``smollm2-1.7b``: SmolLM2-1.7B-Instruct (no grouped KV heads: 192 KiB of KV cache a token);
* ``llama-3.2-1b``: Llama 3.2 1B's layers (8 KV heads: 32 KiB a token) over SmolLM2's 49,152-token
  vocabulary, ~1.0B parameters: the "~1B" LLM issue 34 names, with a sixth of the 1.7B's cache
  (neither fits beside the STT and TTS of 256 sessions on an 80 GB card: benchmarks/notes/voice_agent_gpu.md).

Random weights rarely write the end token, so a reply runs to its ``max_tokens``; the benchmark
caps replies (``--llm-max-tokens``) at about the stand-in's length.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

EOS = 2  # the family's <|im_end|>
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


# Per shape: layers, KV heads, RoPE theta (both: hidden 2048, MLP 8192, 32 query heads, tied embeddings).
SHAPES = {"smollm2-1.7b": (24, 32, 130000.0), "llama-3.2-1b": (16, 8, 500000.0)}


def llama_config(shape: str) -> Any:
    """The transformers ``LlamaConfig`` of ``shape`` (a key of ``SHAPES``) with SmolLM2's vocabulary."""
    from transformers import LlamaConfig

    layers, kv_heads, rope_theta = SHAPES[shape]
    return LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        vocab_size=49152,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


def shipped_tokenizer() -> Path:
    """The folder holding the shipped SmolLM2's tokenizer: its converted copy (converted on first use)."""
    from rtserve.config import ModelPaths
    from rtserve.engines.cascade.llm_loading import plain_folder
    from rtserve.engines.cascade.model_paths import resolve_llm

    paths = ModelPaths()
    gguf = resolve_llm(paths).path
    assert gguf is not None
    return plain_folder(gguf, Path(paths.cache_dir))[0]


def write_random_llm(folder: Path, tokenizer: Path, shape: str = "smollm2-1.7b") -> Path:
    """``folder`` with random bf16 weights of ``shape`` and ``tokenizer``'s files (kept once
    written: the folder appears under its name only when complete)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaForCausalLM

    staging = folder.with_name(f"{folder.name}.partial-{uuid.uuid4().hex[:8]}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(shape)).to(torch.bfloat16)  # type: ignore[arg-type]
    model.generation_config.eos_token_id = EOS
    model.save_pretrained(staging)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, staging / name)
    staging.rename(folder)
    return folder
