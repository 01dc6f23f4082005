"""Load the chat LLM: a GGUF is converted ONCE into a plain transformers folder, then reused.

The CTranslate2 runtime (``llm_ct2``) converts that folder once more, into a CTranslate2
model quantized as ``cascade.llm_compute_type``, cached the same way beside it.

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
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.model_builds import MODEL_BUILDS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedLlm:
    model: Any  # transformers PreTrainedModel, eval mode
    tokenizer: Any  # transformers tokenizer with a chat template
    folder: Path  # the plain folder the model was loaded from
    converted: bool  # True when this load created the cached folder

    def context(self, tokens: int) -> int:
        """``tokens`` (``cascade.llm_context_tokens``), or fewer where the model has fewer positions."""
        return min(tokens, int(getattr(self.model.config, "max_position_embeddings", tokens)))


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
        with MODEL_BUILDS:
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent),
                gguf_file=gguf.name,
                dtype=torch.float32,
                local_files_only=True,
                quantization_config=GgufConfig(dequantize=True),
            )
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot read the GGUF file {gguf}: {exc}") from None
    _publish(
        target, "config.json", lambda staging: (model.save_pretrained(staging), tokenizer.save_pretrained(staging))
    )


def _publish(target: Path, marker: str, write: Callable[[Path], object]) -> None:
    """``write`` a folder into a temporary sibling of ``target``, then rename it into place."""
    staging = target.with_name(f"{target.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        write(staging)
        os.rename(staging, target)
    except OSError as exc:
        if not (target / marker).is_file():  # else a concurrent start won the race: use its copy
            raise ModelUnavailable(
                f"models.cache_dir: cannot write the converted model to {target.parent}: {exc.strerror or exc}"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def plain_folder(path: Path, cache_dir: Path) -> tuple[Path, bool]:
    """The transformers folder of ``path`` (a .gguf is converted and cached on first use),
    and whether this call converted it."""
    if not path.is_file():
        return path, False
    folder = converted_folder(path, cache_dir)
    if (folder / "config.json").is_file():
        return folder, False
    convert_gguf(path, folder)
    return folder, True


def load_tokenizer(folder: Path) -> Any:
    """The chat tokenizer of a plain model folder (it must have a chat template)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot load a chat tokenizer from {folder}: {exc}") from None
    if not tokenizer.chat_template:
        raise ModelUnavailable(f"models.llm: the model in {folder} has no chat template")
    return tokenizer


def load_llm(path: Path, cache_dir: Path, cpu_threads: int, device: str = "cpu", dtype: str = "float32") -> LoadedLlm:
    """``path`` is a .gguf file (converted and cached on first use) or a plain model folder;
    the model is put on ``device`` in ``dtype`` (``torch_dtypes.DTYPES``)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from rtserve.engines.torch_dtypes import DTYPES

    # Per-tensor progress bars are noise in a server log. (transformers leaves it unannotated.)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    torch.set_num_threads(cpu_threads)  # process-wide: torch has one intra-op pool
    folder, converted = plain_folder(path, cache_dir)
    tokenizer = load_tokenizer(folder)
    try:
        # Built in float32, torch's default, then cast: transformers makes its dtype torch's default
        # while it builds a model, and that default is process-wide, so a bfloat16 build here gave
        # tensors the Kyutai STT's engine thread made meanwhile, stepping or loading, the wrong dtype.
        with MODEL_BUILDS:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot load a chat model from {folder}: {exc}") from None
    # transformers' wrapper of Module.to types its first argument as a model
    model.to(device=device, dtype=DTYPES[dtype])  # type: ignore[call-arg]
    model.eval()  # type: ignore[no-untyped-call]  # transformers' PreTrainedModel.eval is unannotated
    return LoadedLlm(model=model, tokenizer=tokenizer, folder=folder, converted=converted)


@dataclass(frozen=True)
class LoadedCt2:
    generator: Any  # ctranslate2.Generator
    tokenizer: Any  # transformers tokenizer with a chat template (of the plain folder)
    eos: int | list[int] | None  # the generation config's end-of-sequence id(s)
    max_positions: int | None  # the model's position limit, when its config names one
    folder: Path  # the CTranslate2 folder
    converted: bool  # True when this load created a cached folder (GGUF or CTranslate2)


def ct2_folder(plain: Path, cache_dir: Path, compute_type: str) -> Path:
    """Where the CTranslate2 copy of the plain folder ``plain`` lives, quantized as ``compute_type``."""
    import ctranslate2

    config = plain / "config.json"
    stat = config.stat()
    identity = f"{plain.resolve()}|{stat.st_mtime_ns}|{compute_type}|ctranslate2 {ctranslate2.__version__}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir / "llm-ct2" / f"{plain.name}-{compute_type}-{key}"


def convert_ct2(plain: Path, target: Path, compute_type: str) -> None:
    """Convert a plain transformers folder into a CTranslate2 model at ``target`` (atomically)."""
    from ctranslate2.converters import TransformersConverter

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelUnavailable(f"models.cache_dir: cannot create {target.parent}: {exc.strerror}") from None
    log.info("converting %s into CTranslate2 %s at %s (once)", plain, compute_type, target)
    try:
        converter = TransformersConverter(str(plain))
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot read {plain} for CTranslate2: {exc}") from None

    def write(staging: Path) -> None:
        try:
            converter.convert(str(staging), quantization=compute_type)
        except (NotImplementedError, ValueError) as exc:
            raise ModelUnavailable(f"models.llm: CTranslate2 cannot convert the model in {plain}: {exc}") from None

    _publish(target, "model.bin", write)


def load_ct2(path: Path, cache_dir: Path, cpu_threads: int, compute_type: str, lanes: int = 1) -> LoadedCt2:
    """``path`` as for ``load_llm``; converted for CTranslate2 on first use, then memory-mapped.
    ``lanes``: batches CTranslate2 decodes at once (its inter_threads), ``cpu_threads`` each."""
    import ctranslate2
    from transformers import GenerationConfig

    plain, converted = plain_folder(path, cache_dir)
    tokenizer = load_tokenizer(plain)
    folder = ct2_folder(plain, cache_dir, compute_type)
    if not (folder / "model.bin").is_file():
        convert_ct2(plain, folder, compute_type)
        converted = True
    try:
        generator = ctranslate2.Generator(
            str(folder), device="cpu", compute_type=compute_type, intra_threads=cpu_threads, inter_threads=lanes
        )
    except (RuntimeError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: CTranslate2 cannot load {folder}: {exc}") from None
    try:
        eos = GenerationConfig.from_pretrained(str(plain), local_files_only=True).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's end token alone
        eos = None
    model_config = json.loads((plain / "config.json").read_text())
    return LoadedCt2(
        generator=generator,
        tokenizer=tokenizer,
        eos=eos,
        max_positions=model_config.get("max_position_embeddings"),
        folder=folder,
        converted=converted,
    )
