"""The chat LLM (SmolLM2-135M-Instruct by default) with streamed, cancellable generation.

Sharing and batching: one model copy, driven by ONE dedicated decode thread
(``config.models.cpu_threads`` intra-op threads). Up to ``config.cascade.llm_max_active``
requests are decoded together by token-level round-robin: each loop admits waiting requests (one
prefill each), then advances every active request by one token. Requests from different
sessions therefore progress side by side (nobody waits for another's whole reply), but
each token is its own forward pass: the per-request KV caches differ in length, so they
are not stacked into one tensor batch. More requests wait in a bounded queue
(``llm_max_waiting``); beyond it a request fails at once with ``resource_exhausted``.

Cancellation: closing the ``generate`` iterator (or cancelling the task iterating it)
flags the request; the thread drops it before its next token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.llm_loading import LoadedLlm, load_llm
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ModelLocation
from rtserve.engines.cascade.tool_calls import (CALL_OPEN, CallDecoding, CallGuide, forced, render,
                                                template_knows_tools, uses_tools)
from rtserve.engines.protocols import CapacityExhausted, ChatMessage, EngineError, SamplingParams, TokenDelta
from rtserve.engines.tools import check_tools

log = logging.getLogger(__name__)

_GREEDY_BELOW = 1e-5  # temperatures this small mean argmax


def check_params(params: SamplingParams) -> None:
    problems = []
    if not 0.0 <= params.temperature <= 2.0:
        problems.append(f"temperature must be in [0, 2], got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        problems.append(f"top_p must be in (0, 1], got {params.top_p}")
    if params.max_tokens < 1:
        problems.append(f"max_tokens must be at least 1, got {params.max_tokens}")
    if problems:
        raise EngineError("; ".join(problems), code="invalid_value")


@dataclass(eq=False)
class _Request:
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    fit_history: bool
    deliver: Callable[[TokenDelta | EngineError], None]  # thread-safe hand-off to the event loop
    cancelled: bool = False
    # Decode state, touched only on the LLM thread:
    prompt_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    emitted_chars: int = 0
    cache: Any = None
    logits: Any = None
    generator: Any = None
    calls: CallDecoding | None = None  # tools offered: the call grammar and text/call split
    fed: int = 0  # generated tokens already in the KV cache (more than one behind after a fast-forward)


class _Decoder:
    """Everything that runs on the LLM thread: prompt building, prefill, steps, sampling."""

    def __init__(self, llm: LoadedLlm, context_tokens: int, metrics: CascadeMetrics) -> None:
        self.model = llm.model
        self.tokenizer = llm.tokenizer
        self._metrics = metrics
        self.context_tokens = min(context_tokens, int(getattr(llm.model.config, "max_position_embeddings",
                                                              context_tokens)))
        eos = llm.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if llm.tokenizer.eos_token_id is not None:
            eos_ids.add(llm.tokenizer.eos_token_id)
        self._eos = frozenset(eos_ids)
        self._native_tools = template_knows_tools(llm.tokenizer)
        # Built by the first request with tools, which pays ~4 s once (llguidance's token trie
        # and first mask); requests without tools never pay it.
        self._guide: CallGuide | None = None

    def prompt_ids(self, messages: Sequence[ChatMessage], max_tokens: int, fit_history: bool,
                   params: SamplingParams = SamplingParams()) -> list[int]:
        """The chat-templated prompt; with ``fit_history`` the oldest turns go until it fits.
        Tools, calls and results are rendered by ``tool_calls.render``; a forced call's marker
        ends the prompt."""
        turns, tools = render(messages, params, self._native_tools)
        suffix = self.tokenizer.encode(CALL_OPEN + "\n", add_special_tokens=False) if forced(params) else []
        budget = self.context_tokens - max_tokens
        while True:
            ids = self._render(turns, tools, suffix)
            if len(ids) <= budget:
                return list(ids)
            droppable = [i for i, t in enumerate(turns[:-1]) if t["role"] != "system"]
            if not fit_history or not droppable:
                raise EngineError(f"the prompt needs {len(ids)} tokens; with max_tokens={max_tokens} it "
                                  f"exceeds this model's context of {self.context_tokens} tokens",
                                  code="context_length_exceeded")
            del turns[droppable[0]]

    def _render(self, turns: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                suffix: Sequence[int] = ()) -> list[int]:
        """Token ids of ``turns`` with the generation prompt (``tools`` for a template that takes
        them), then ``suffix``."""
        return list(self.tokenizer.apply_chat_template(turns, tools=tools, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)) + list(suffix)

    def prefill(self, request: _Request) -> TokenDelta | None:
        import torch
        from transformers import DynamicCache

        started = time.perf_counter()
        ids = self.prompt_ids(request.messages, request.params.max_tokens, request.fit_history, request.params)
        if uses_tools(request.params):
            if self._guide is None:
                self._guide = CallGuide(self.tokenizer, self.model.config.vocab_size)
            request.calls = self._guide.start(request.params)
        request.prompt_tokens = len(ids)
        if request.params.seed is not None:
            request.generator = torch.Generator().manual_seed(request.params.seed)
        request.cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=torch.tensor([ids]), cache=request.cache, use_cache=True, logits_to_keep=1)
        request.logits = out.logits[0, -1]
        self._metrics.model_call_seconds.labels("llm_prefill").observe(time.perf_counter() - started)
        return self.emit_next(request)

    def step(self, request: _Request) -> TokenDelta | None:
        import torch

        started = time.perf_counter()
        new, request.fed = request.generated[request.fed:], len(request.generated)
        out = self.model(input_ids=torch.tensor([new]), cache=request.cache, use_cache=True)
        request.logits = out.logits[0, -1]
        self._metrics.model_call_seconds.labels("llm_token").observe(time.perf_counter() - started)
        return self.emit_next(request)

    def _sample(self, request: _Request) -> int:
        import torch

        logits = request.logits.float()
        if request.calls is not None:
            request.calls.mask(logits)
        params = request.params
        if params.temperature < _GREEDY_BELOW:
            return int(torch.argmax(logits))
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
            if (len(request.generated) >= params.max_tokens
                    or request.prompt_tokens + len(request.generated) >= self.context_tokens):
                finish = "length"
        text = self.tokenizer.decode(request.generated, skip_special_tokens=True)
        visible, call = len(text), None
        if calls is not None:
            visible = calls.visible_end(text)
            call = calls.call_delta(text)
            if calls.call_start is not None:  # a call is being written: the text before it is all there is
                text = text[:visible]
                if calls.complete:
                    finish = "tool_calls"
                elif calls.failed:
                    finish = finish or "stop"
        for stop in params.stop:
            at = text.find(stop, max(0, request.emitted_chars - len(stop)))
            if stop and at >= 0:
                text, finish = text[:at], "stop"
        end = len(text)
        if finish is None:
            if text.endswith("\ufffd") and call is None:  # a multi-byte character is still incomplete
                return None
            # Hold back a tail that could still become a stop string (or the call marker).
            end = min(end - max((len(s) - 1 for s in params.stop), default=0), visible)
        delta = text[request.emitted_chars:end] if end > request.emitted_chars else ""
        request.emitted_chars = max(request.emitted_chars, end)
        if not delta and finish is None and call is None:
            return None
        return TokenDelta(delta, finish_reason=finish, prompt_tokens=request.prompt_tokens,
                          completion_tokens=len(request.generated), tool_call=call)


class _DecodeLoop:
    """The dedicated LLM thread: admit, prefill, round-robin steps."""

    def __init__(self, max_active: int, max_waiting: int) -> None:
        self._max_active = max_active
        self._max_waiting = max_waiting
        self._waiting: deque[_Request] = deque()
        self._active_count = 0  # written by the thread under the lock
        self._cond = threading.Condition()
        self._stopping = False
        self._stop_reason: EngineError = ModelNotReady("the language model stopped")
        self._decoder: _Decoder | None = None
        self._thread: threading.Thread | None = None

    def start(self, decoder: _Decoder) -> None:
        self._decoder = decoder
        self._thread = threading.Thread(target=self._serve, name="rtserve-llm", daemon=True)
        self._thread.start()

    def submit(self, request: _Request) -> None:
        with self._cond:
            if self._stopping:
                raise ModelNotReady("the language model is shutting down")
            if len(self._waiting) + self._active_count >= self._max_waiting + self._max_active:
                raise CapacityExhausted(f"the language model is busy ({self._active_count} requests running, "
                                        f"{len(self._waiting)} waiting); retry shortly")
            self._waiting.append(request)
            self._cond.notify()

    def stop(self, reason: EngineError | None = None) -> None:
        """End the thread; requests still waiting or running get ``reason``."""
        with self._cond:
            self._stopping = True
            self._stop_reason = reason or ModelNotReady("the language model stopped")
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _serve(self) -> None:
        import torch

        assert self._decoder is not None
        active: list[_Request] = []
        with torch.inference_mode():
            while True:
                with self._cond:
                    self._active_count = len(active)
                    while not self._stopping and not self._waiting and not active:
                        self._cond.wait()
                    if self._stopping:
                        pending = list(self._waiting) + active
                        self._waiting.clear()
                        break
                    admitted = []
                    while self._waiting and len(active) + len(admitted) < self._max_active:
                        admitted.append(self._waiting.popleft())
                    self._active_count = len(active) + len(admitted)
                for request in admitted:
                    if self._advance(request, self._decoder.prefill):
                        active.append(request)
                active = [r for r in active if self._advance(r, self._decoder.step)]
        for request in pending:
            request.deliver(self._stop_reason)
        self._decoder = None  # the model goes with it (sleep mode frees it)

    @staticmethod
    def _advance(request: _Request, move: Callable[[_Request], TokenDelta | None]) -> bool:
        """Run one prefill/step; deliver its delta or error. True while the request goes on."""
        if request.cancelled:
            request.cache = request.logits = None
            return False
        try:
            delta = move(request)
        except EngineError as exc:
            request.deliver(exc)
            return False
        except Exception:
            log.exception("LLM generation failed")
            request.deliver(EngineError("text generation failed", code="generation_failed"))
            return False
        if delta is not None:
            request.deliver(delta)
            if delta.finish_reason is not None:
                request.cache = request.logits = None
                return False
        return True


class SmolLlm:
    """The ``LLMEngine`` over a transformers causal LM with a chat template."""

    def __init__(self, location: ModelLocation, *, cache_dir: Path, cpu_threads: int, max_active: int,
                 max_waiting: int, context_tokens: int, metrics: CascadeMetrics) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._cache_dir = cache_dir
        self._cpu_threads = cpu_threads
        self._context_tokens = context_tokens
        self._metrics = metrics
        self._max_active, self._max_waiting = max_active, max_waiting
        self._loop = _DecodeLoop(max_active, max_waiting)
        self._ready = False
        self._asleep = False
        self.loaded: LoadedLlm | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        assert self._path is not None
        started = time.perf_counter()
        self.loaded = await asyncio.to_thread(load_llm, self._path, self._cache_dir, self._cpu_threads)
        self._loop.start(_Decoder(self.loaded, self._context_tokens, self._metrics))
        self._ready = True
        log.info("LLM %s ready in %.1f s (from %s%s)", self.model_name, time.perf_counter() - started,
                 self.loaded.folder, ", converted now" if self.loaded.converted else "")

    def stop(self) -> None:
        self._ready = False
        self._loop.stop()

    # Sleep mode (``SleepStage``): the decode thread ends (its requests get engine_sleeping)
    # and takes the model with it; wake loads the model (from the converted cache) and a new thread.
    stage = "llm"

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def release(self) -> None:
        self._asleep = True
        self._ready = False
        loop, self._loop = self._loop, _DecodeLoop(self._max_active, self._max_waiting)
        loop.stop(EngineSleeping())
        await asyncio.to_thread(loop.join)
        self.loaded = None

    async def restore(self) -> None:
        await self.start()
        self._asleep = False

    async def generate(self, messages: Sequence[ChatMessage], params: SamplingParams, *,
                       fit_history: bool = False) -> AsyncIterator[TokenDelta]:
        """Token deltas; the last carries ``finish_reason`` and usage counts.

        ``fit_history`` (used by voice sessions) drops the oldest non-system messages when
        the conversation outgrows the context; without it that is ``context_length_exceeded``.
        """
        if not self._ready:
            raise EngineSleeping() if self._asleep else ModelNotReady("the language model is still loading")
        check_params(params)
        check_tools(params.tools, params.tool_choice)  # transports checked already; a direct caller may not have
        if not messages:
            raise EngineError("messages must not be empty", code="invalid_value")
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[TokenDelta | EngineError] = asyncio.Queue()  # <= max_tokens + 1 items

        def deliver(item: TokenDelta | EngineError) -> None:
            try:
                loop.call_soon_threadsafe(deltas.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                request.cancelled = True

        request = _Request(tuple(messages), params, fit_history, deliver)
        self._loop.submit(request)
        try:
            while True:
                item = await deltas.get()
                if isinstance(item, EngineError):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            request.cancelled = True
