"""Load the chat LLM: a GGUF is converted ONCE into a plain transformers folder, then reused.

Reading a GGUF through transformers de-quantizes every tensor and rebuilds the tokenizer
(tens of seconds on a small CPU). The result is saved with ``save_pretrained`` under
``config.models.cache_dir`` in a folder keyed by the GGUF's identity (path, size, mtime)
and the transformers version, so later starts memory-map plain safetensors instead.
The folder appears under its final name only once complete (written to a temporary
sibling, then renamed), so a crash or a concurrent start never leaves a half cache.
Everything here blocks: it runs on the LLM thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtserve.engines.cascade.errors import ModelUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedLlm:
    model: Any  # transformers PreTrainedModel, eval mode
    tokenizer: Any  # transformers tokenizer with a chat template
    folder: Path  # the plain folder the model was loaded from
    converted: bool  # True when this load created the cached folder


def converted_folder(gguf: Path, cache_dir: Path) -> Path:
    """Where the converted copy of ``gguf`` lives (whether or not it exists yet)."""
    import transformers

    stat = gguf.stat()
    identity = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|transformers {transformers.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir / "llm" / f"{gguf.stem}-{key}"


def convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize ``gguf`` into a plain model folder at ``target`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelUnavailable(f"models.cache_dir: cannot create {target.parent}: {exc.strerror}") from None
    log.info("converting %s into %s (once)", gguf, target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True,
            quantization_config=GgufConfig(dequantize=True))
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot read the GGUF file {gguf}: {exc}") from None
    staging = target.with_name(f"{target.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.rename(staging, target)
    except OSError as exc:
        if not (target / "config.json").is_file():  # else a concurrent start won the race: use its copy
            raise ModelUnavailable(f"models.cache_dir: cannot write the converted model to {target.parent}: "
                                   f"{exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_llm(path: Path, cache_dir: Path, cpu_threads: int) -> LoadedLlm:
    """``path`` is a .gguf file (converted and cached on first use) or a plain model folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor progress bars are noise in a server log
    torch.set_num_threads(cpu_threads)  # process-wide: torch has one intra-op pool
    converted = False
    folder = path
    if path.is_file():
        folder = converted_folder(path, cache_dir)
        if not (folder / "config.json").is_file():
            convert_gguf(path, folder)
            converted = True
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot load a chat model from {folder}: {exc}") from None
    if not tokenizer.chat_template:
        raise ModelUnavailable(f"models.llm: the model in {folder} has no chat template")
    model.eval()
    return LoadedLlm(model=model, tokenizer=tokenizer, folder=folder, converted=converted)
