"""The transformers runtime of the cascade LLM (``cascade.llm_runtime: transformers``).

The fallback runtime, and the one that decodes function calls: llguidance masks the
logits of every step (``tool_calls``), which needs the logits in our hands.

Sharing and batching: one model copy, driven by ONE dedicated decode thread
(``config.models.cpu_threads`` intra-op threads). Up to ``config.cascade.llm_max_active``
requests are decoded together by token-level round-robin: each loop admits waiting requests
(one prefill each), then advances every active request by one token. Requests from
different sessions therefore progress side by side (nobody waits for another's whole
reply), but each token is its own forward pass: the per-request KV caches differ in length,
so they are not stacked into one tensor batch (``llm_ct2`` batches them). Admission,
prompts, text deltas and the async API are ``llm_stage``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rtserve.engines.cascade.llm_loading import LoadedLlm, load_llm
from rtserve.engines.cascade.llm_stage import (
    GREEDY_BELOW,
    DecodeQueue,
    LlmRequest,
    LlmStage,
    Prompter,
    eos_ids,
    fail_request,
    text_delta,
)
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.tool_calls import CallDecoding, CallGuide, uses_tools
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta


@dataclass(eq=False)
class _Request(LlmRequest):
    cache: Any = None
    logits: Any = None
    generator: Any = None
    calls: CallDecoding | None = None  # tools offered: the call grammar and text/call split
    fed: int = 0  # generated tokens already in the KV cache (more than one behind after a fast-forward)


class _Decoder:
    """Everything that runs on the LLM thread: prefill, steps, sampling."""

    def __init__(self, llm: LoadedLlm, context_tokens: int, metrics: CascadeMetrics, top_k: int = 0) -> None:
        self.model = llm.model
        self._top_k = top_k  # 0: the whole vocabulary
        self.tokenizer = llm.tokenizer
        self._metrics = metrics
        context = llm.context(context_tokens)
        self.prompter = Prompter(llm.tokenizer, context)
        self.context_tokens = context
        self._eos = eos_ids(llm.tokenizer, llm.model.generation_config.eos_token_id)
        # Built by the first request with tools, which pays ~4 s once (llguidance's token trie
        # and first mask); requests without tools never pay it.
        self._guide: CallGuide | None = None

    def prefill(self, request: _Request) -> TokenDelta | None:
        import torch
        from transformers import DynamicCache

        started = time.perf_counter()
        ids = self.prompter.prompt_ids(request.messages, request.params.max_tokens, request.fit_history, request.params)
        if uses_tools(request.params):
            if self._guide is None:
                self._guide = CallGuide(self.tokenizer, self.model.config.vocab_size)
            request.calls = self._guide.start(request.params)
        request.prompt_tokens = len(ids)
        if request.params.seed is not None:
            request.generator = torch.Generator().manual_seed(request.params.seed)
        request.cache = DynamicCache(config=self.model.config)
        prompt = torch.tensor([ids], device=self.model.device)
        out = self.model(input_ids=prompt, cache=request.cache, use_cache=True, logits_to_keep=1)
        request.logits = out.logits[0, -1].cpu()  # sampled on the CPU: masks and seeded generators live there
        self._metrics.model_call_seconds.labels("llm_prefill").observe(time.perf_counter() - started)
        return self.emit_next(request)

    def step(self, request: _Request) -> TokenDelta | None:
        import torch

        started = time.perf_counter()
        new, request.fed = request.generated[request.fed :], len(request.generated)
        out = self.model(input_ids=torch.tensor([new], device=self.model.device), cache=request.cache, use_cache=True)
        request.logits = out.logits[0, -1].cpu()
        self._metrics.model_call_seconds.labels("llm_token").observe(time.perf_counter() - started)
        return self.emit_next(request)

    def _sample(self, request: _Request) -> int:
        import torch

        logits = request.logits.float()
        if request.calls is not None:
            request.calls.mask(logits)
        params = request.params
        if params.temperature < GREEDY_BELOW:
            return int(torch.argmax(logits))
        if 0 < self._top_k < logits.numel():
            logits = logits.masked_fill(logits < torch.topk(logits, self._top_k).values[-1], float("-inf"))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > params.top_p
            sorted_probs[outside] = 0.0
            return int(order[torch.multinomial(sorted_probs, 1, generator=request.generator)])
        return int(torch.multinomial(probs, 1, generator=request.generator))

    def emit_next(self, request: _Request) -> TokenDelta | None:
        """Sample one token; the text it completes (if any) as a delta, final when finished.
        With tools, text from the call marker on is a call, delivered as ``tool_call`` pieces."""
        token = self._sample(request)
        params = request.params
        calls = request.calls
        finish: Literal["stop", "length", "tool_calls"] | None = None
        if token in self._eos:
            finish = "stop"
        else:
            request.generated.append(token)
            self._metrics.llm_tokens.inc()
            if calls is not None:
                calls.consume(token)
                limit = min(params.max_tokens, self.context_tokens - request.prompt_tokens)
                forced = calls.fast_forward(limit - len(request.generated) - 1)
                request.generated.extend(forced)
                self._metrics.llm_tokens.inc(len(forced))
            if (
                len(request.generated) >= params.max_tokens
                or request.prompt_tokens + len(request.generated) >= self.context_tokens
            ):
                finish = "length"
        text = self.tokenizer.decode(request.generated, skip_special_tokens=True)
        if calls is None:
            return text_delta(request, text, finish)
        visible = calls.visible_end(text)
        call = calls.call_delta(text)
        if calls.call_start is not None:  # a call is being written: the text before it is all there is
            text = text[:visible]
            if calls.complete:
                finish = "tool_calls"
            elif calls.failed or finish == "stop":  # the budget's end is "length", arguments cut short
                raise calls.unfinished()
        return text_delta(request, text, finish, visible=visible, call=call)


class _RoundRobin(DecodeQueue):
    """The dedicated LLM thread: admit, prefill, round-robin steps."""

    def __init__(self, decoder: _Decoder, max_active: int, max_waiting: int) -> None:
        super().__init__(max_active, max_waiting)
        self._decoder: _Decoder | None = decoder
        self.prompter = decoder.prompter

    def serve(self) -> None:
        import torch

        assert self._decoder is not None
        decoder = self._decoder
        active: list[_Request] = []
        with torch.inference_mode():
            while (admitted := self.admit(active)) is not None:
                for request in admitted:
                    assert isinstance(request, _Request)
                    if self._advance(request, decoder.prefill):
                        active.append(request)
                active = [r for r in active if self._advance(r, decoder.step)]

    def release_model(self) -> None:
        self._decoder = None

    @staticmethod
    def _advance(request: _Request, move: Callable[[_Request], TokenDelta | None]) -> bool:
        """Run one prefill/step; deliver its delta or error. True while the request goes on."""
        if request.cancelled:
            request.cache = request.logits = None
            return False
        try:
            delta = move(request)
        except Exception as exc:  # noqa: BLE001 - the request fails, the batch goes on
            fail_request(request, exc)
            return False
        if delta is not None:
            request.deliver(delta)
            if delta.finish_reason is not None:
                request.cache = request.logits = None
                return False
        return True


class SmolLlm(LlmStage):
    """The ``LLMEngine`` over a transformers causal LM with a chat template. ``shared``: a model
    another runtime loaded (``llm_batched``), decoded here instead of loading one more copy."""

    def __init__(self, *args: Any, shared: LoadedLlm | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shared = shared
        self.loaded: LoadedLlm | None = None

    async def _open(self) -> DecodeQueue:
        assert self._path is not None
        started = time.perf_counter()
        loaded = self._shared
        if loaded is None:
            loaded = await asyncio.to_thread(load_llm, self._path, self._cache_dir, self._cpu_threads)
        self.loaded = loaded
        queue = _RoundRobin(
            _Decoder(loaded, self._context_tokens, self._metrics, self._sampling.top_k),
            self._max_active,
            self._max_waiting,
        )
        queue.start()
        self._log_ready("transformers", started, loaded.folder, loaded.converted)
        return queue

    async def release(self) -> None:
        await super().release()
        self.loaded = None

    @staticmethod
    def new_request(
        messages: tuple[ChatMessage, ...],
        params: SamplingParams,
        fit_history: bool,
        deliver: Callable[[TokenDelta | EngineError], None],
    ) -> LlmRequest:
        return _Request(messages, params, fit_history, deliver)
