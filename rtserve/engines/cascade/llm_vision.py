"""The vision runtime of the cascade LLM (``cascade.llm_runtime: transformers_vision``): a
vision-language model (SmolVLM/Idefics3, LLaVA, ... any ``AutoModelForImageTextToText`` with
an ``AutoProcessor``) that sees the images of user turns (docs/video.md#the-llm-stage).

Messages reach it as every LLM stage gets them; a user message's images become OpenAI
``image_url`` parts (``tools.openai_turns``, the same turns vLLM is sent), which this runtime
turns into the processor's own ``{"type": "image"}`` parts plus the decoded images: the
processor's chat template places the image tokens and ``pixel_values`` go into the prefill.
Decoding after the prefill is the text runtime's (``llm._Decoder``, ``llm._RoundRobin``):
the images live in the KV cache. Function calls are not decoded here (a typed refusal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.cascade.llm import SmolLlm, _Decoder, _Request, _RoundRobin
from rtserve.engines.cascade.llm_loading import LoadedLlm
from rtserve.engines.cascade.llm_stage import DecodeQueue
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.tool_calls import uses_tools
from rtserve.engines.errors import EngineError
from rtserve.engines.model_builds import MODEL_BUILDS
from rtserve.engines.tools import openai_turns
from rtserve.engines.values import ChatMessage, TokenDelta
from rtserve.errors import CONTEXT_LENGTH_EXCEEDED, INVALID_VALUE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedVlm(LoadedLlm):
    processor: Any = None  # transformers ProcessorMixin: chat template, image processor, tokenizer


def load_vlm(path: Path, cpu_threads: int) -> LoadedVlm:
    """A vision-language model folder (``models.llm``), loaded in float32 for the CPU."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.set_num_threads(cpu_threads)
    try:
        processor = AutoProcessor.from_pretrained(str(path), local_files_only=True)  # type: ignore[no-untyped-call]
        with MODEL_BUILDS:
            model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"models.llm: cannot load a vision-language model from {path}: {exc}") from None
    tokenizer = processor.tokenizer
    if not tokenizer.chat_template:  # many VLMs keep the template on the processor only
        tokenizer.chat_template = processor.chat_template
    if not tokenizer.chat_template:
        raise ModelUnavailable(f"models.llm: the model in {path} has no chat template")
    model.eval()  # type: ignore[no-untyped-call]  # transformers' PreTrainedModel.eval is unannotated
    return LoadedVlm(model=model, tokenizer=tokenizer, folder=path, converted=False, processor=processor)


def visual_turns(messages: tuple[ChatMessage, ...]) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat turns with each OpenAI ``image_url`` part as the processor's ``{"type": "image"}``,
    and the image URLs in the order the template will place them."""
    urls: list[str] = []
    turns = []
    for turn in openai_turns(messages):
        content = turn["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "image_url":
                    urls.append(part["image_url"]["url"])
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            turn = {**turn, "content": parts}
        turns.append(turn)
    return turns, urls


class _VisionDecoder(_Decoder):
    def __init__(self, llm: LoadedVlm, context_tokens: int, metrics: CascadeMetrics, top_k: int = 0) -> None:
        super().__init__(llm, context_tokens, metrics, top_k)
        self._processor = llm.processor

    def prefill(self, request: _Request) -> TokenDelta | None:
        import torch
        from transformers import DynamicCache

        from rtserve.codecs.images import url_image

        if uses_tools(request.params):
            raise EngineError(
                "The vision model does not call functions; send the request without tools", code=INVALID_VALUE
            )
        started = time.perf_counter()
        messages = request.messages
        while True:
            turns, urls = visual_turns(messages)
            text = self._processor.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
            inputs = self._processor(text=text, images=[url_image(u) for u in urls] or None, return_tensors="pt")
            length = int(inputs["input_ids"].shape[1])
            if length + request.params.max_tokens <= self.context_tokens:
                break
            droppable = [i for i, m in enumerate(messages[:-1]) if m.role != "system"]
            if not request.fit_history or not droppable:
                raise EngineError(
                    f"the prompt ({length} tokens) and max_tokens exceed the context of {self.context_tokens} tokens",
                    code=CONTEXT_LENGTH_EXCEEDED,
                )
            messages = messages[: droppable[0]] + messages[droppable[0] + 1 :]  # the oldest turn goes
        request.prompt_tokens = length
        if request.params.seed is not None:
            request.generator = torch.Generator().manual_seed(request.params.seed)
        request.cache = DynamicCache(config=self.model.config)
        out = self.model(**inputs, cache=request.cache, use_cache=True, logits_to_keep=1)
        request.logits = out.logits[0, -1]
        self._metrics.model_call_seconds.labels("llm_prefill").observe(time.perf_counter() - started)
        return self.emit_next(request)


class VisionLlm(SmolLlm):
    """The ``LLMEngine`` over a transformers vision-language model."""

    supports_vision = True

    async def _open(self) -> DecodeQueue:
        assert self._path is not None
        started = time.perf_counter()
        loaded = await asyncio.to_thread(load_vlm, self._path, self._cpu_threads)
        self.loaded = loaded
        queue = _RoundRobin(
            _VisionDecoder(loaded, self._context_tokens, self._metrics, self._sampling.top_k),
            self._max_active,
            self._max_waiting,
        )
        queue.start()
        log.info("LLM %s (transformers, vision) ready in %.1f s", self.model_name, time.perf_counter() - started)
        return queue
